"""Run a bundle's reproduction under the fault emulator: "persistent here" on an emulated node, testable.

    result = reproduce_emulated(Path("INC"), profile, fault_seed=0, repeats=5)   # bundle_reproduce.reproduce's dict

reproduce.py needs only torch, so it cannot start sdctrace's emulator; ``sdc incident reproduce --profile P``
runs the very same functions (replay/bundle_reproduce.py, imported) in its own process with the emulator around
each run. Each run executes the op sequence inside a module at the site's path (an empty module tree with that
path: the emulator names a rule's ``sites`` by module paths) at the incident's step and microbatch, as attempt
1, 2, ... of that step: later moments in time, in which a ``persistent`` rule repeats the draws of the suspect's
run (attempt 0) and a transient one draws afresh (a rule with ``attempts = [0]`` fires in the first run only).
The draws of a (step, microbatch) advance with the eligible op calls, so a rule whose ``sites`` match only the
captured site repeats exactly; one that also hit ops before the site drew some of its stream there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from faults import FaultEmulator, FaultProfile
from replay.bundle_reproduce import load, reproduce

Run = Callable[[], list[torch.Tensor]]


class _Site(nn.Module):
    """A module at the site's path whose forward runs the op sequence it is given."""

    def forward(self, run: Run) -> list[torch.Tensor]:
        return run()


def site_tree(path: str) -> tuple[nn.Module, nn.Module]:
    """A root module and, at ``path`` below it, a `_Site`."""
    root: nn.Module = nn.Module()
    parent, parts = root, path.split(".")
    for part in parts[:-1]:
        child = nn.Module()
        parent.add_module(part, child)
        parent = child
    leaf = _Site()
    parent.add_module(parts[-1], leaf)
    return root, leaf


def reproduce_emulated(bundle: Path, profile: FaultProfile, *, fault_seed: int = 0, repeats: int = 5,
                       device: str | None = None) -> dict[str, Any]:
    """`bundle_reproduce.reproduce` with run ``i`` under ``profile``'s emulator as attempt ``i + 1`` of the
    incident's step; the result adds the fault events each run drew."""
    manifest, _ = load(bundle)
    site = manifest["site"]
    root, leaf = site_tree(site["name"])
    faults: list[list[dict[str, Any]]] = []

    def call(i: int) -> Callable[[Run], list[torch.Tensor]]:
        drawn: list[dict[str, Any]] = []
        faults.append(drawn)
        emulator = FaultEmulator(profile, root, clock=lambda: (site["step"], site["microbatch"], i + 1),
                                 sink=lambda kind, fields: drawn.append(fields) if kind == "fault" else None,
                                 seed=fault_seed, sites=re.escape(site["name"]))

        def run(sequence: Run) -> list[torch.Tensor]:
            with emulator:
                return leaf(sequence)

        return run

    result = reproduce(bundle, repeats, device, call)
    return {**result, "emulated": {"profile": profile.name, "fault_seed": fault_seed,
                                   "faults_per_run": [len(f) for f in faults]}}
