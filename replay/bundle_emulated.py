"""Run a bundle's reproduction under the fault emulator: "persistent here" on an emulated node, testable.

    result = reproduce_emulated(Path("INC"), profile, fault_seed=0, repeats=5)   # bundle_reproduce.reproduce's dict

reproduce.py needs only torch, so it cannot start sdctrace's emulator; ``sdc incident reproduce --fault-profile
P`` runs the very same functions (replay/bundle_reproduce.py, imported) in its own process with the emulator
around each run. Each op runs inside the modules it ran in (an empty module tree with the site's path and its
submodules' as the manifest records them: the emulator names a rule's ``sites`` by module paths) at the
incident's step and microbatch, as attempt
1, 2, ... of that step: later moments in time, in which a ``persistent`` rule repeats the draws of the suspect's
run (attempt 0) and a transient one draws afresh (a rule with ``attempts = [0]`` fires in the first run only).
The draws of a (step, microbatch) advance with the eligible op calls, so a rule whose ``sites`` match only the
captured site repeats exactly; one that also hit ops before the site drew some of its stream there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from faults import FaultEmulator, FaultProfile
from replay.bundle_check import FIX, MANIFEST, BundleError, load
from replay.bundle_reproduce import Within, reproduce


class _Module(nn.Module):
    """A module of the site's tree whose forward runs what it is given."""

    def forward(self, run: Callable[[], Any]) -> Any:
        return run()


def site_tree(site: str, below: set[str]) -> tuple[nn.Module, Within]:
    """A root module with empty modules at ``site`` and at each path ``below`` it (relative), and the `Within`
    that runs an op inside the site's module and the chain of modules down to its own."""
    root: nn.Module = nn.Module()
    paths = {site} | {f"{site}.{rel}" for rel in below if rel}
    for path in sorted(paths, key=lambda p: p.count(".")):
        parent, parts = root, path.split(".")
        for part in parts:
            if not hasattr(parent, part):
                parent.add_module(part, _Module())
            elif not isinstance(getattr(parent, part), nn.Module):  # a module attribute's name ("training")
                raise BundleError(
                    f"the module path {path!r} names an attribute of nn.Module, which no submodule "
                    "can be named; capture the bundle again with `sdc incident`"
                )
            parent = getattr(parent, part)

    def within(rel: str, op: Callable[[], Any]) -> Any:
        chain = [site, *(f"{site}.{'.'.join(rel.split('.')[: i + 1])}" for i in range(rel.count(".") + 1) if rel)]
        run = op
        for path in reversed(chain):
            run = functools.partial(root.get_submodule(path), run)
        return run()

    return root, within


def reproduce_emulated(
    bundle: Path, profile: FaultProfile, *, fault_seed: int = 0, repeats: int = 5, device: str | None = None
) -> dict[str, Any]:
    """`bundle_reproduce.reproduce` with run ``i`` under ``profile``'s emulator as attempt ``i + 1`` of the
    incident's step; the result adds the fault events each run drew."""
    loaded = load(bundle)  # every name checked: module paths without dunders, a site that is a module path
    site = loaded.site
    rank = captured_rank(loaded.manifest, bundle / MANIFEST)  # a rule's `ranks` picks the rank the site ran on
    root, inside = site_tree(site["name"], {op.module for op in loaded.ops})
    faults: list[list[dict[str, Any]]] = []

    def run(i: int) -> tuple[FaultEmulator, Within]:
        drawn: list[dict[str, Any]] = []
        faults.append(drawn)
        emulator = FaultEmulator(
            profile,
            root,
            clock=lambda: (site["step"], site["microbatch"], i + 1),
            sink=lambda kind, fields: drawn.append(fields) if kind == "fault" else None,
            seed=fault_seed,
            sites=(site["name"],),
            rank=rank,
        )
        return emulator, inside

    result = reproduce(bundle, repeats, device, run, loaded)
    return {
        **result,
        "emulated": {"profile": profile.name, "fault_seed": fault_seed, "faults_per_run": [len(f) for f in faults]},
    }


def captured_rank(manifest: dict[str, Any], source: Path) -> int:
    """The rank the site was captured on (``golden.rank``: a pipeline's stage); 0 in a bundle without it."""
    golden = manifest.get("golden")
    rank = golden.get("rank", 0) if isinstance(golden, dict) else 0
    if type(rank) is not int or not 0 <= rank < 1 << 16:
        raise BundleError(f"{source}: golden.rank {str(rank)[:40]} is no rank (0 to 65535); {FIX}")
    return rank
