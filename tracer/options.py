"""The Tracer's options, in two typed groups that the library and ``sdc record`` share.

    run = RunInfo(node_label="node-7", config=cfg, seed=seed)
    with Tracer(model, optimizer, out="runs/node-7", run=run, options=TraceOptions(sites=r"h\\.\\d+\\.attn")):
        ...

`RunInfo` says which run this is: it goes into the run header, and its config,
seed and data order decide which runs pair. `TraceOptions` says what is recorded
and how it is written; the defaults trace everything. Both are frozen and checked
when built, so a wrong value fails where it is written, naming the field.
``TraceOptions.to_dict``/``from_dict`` carry the options to the ranks ``sdc record``
launches (JSON, so only a regex or None as ``sites``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

from tracer.errors import ConfigError
from tracer.log.records import Phase
from tracer.sites import SiteSpec


@dataclass(frozen=True)
class CapturePolicy:
    """Which full tensors to keep in the blob store; fingerprints are always recorded."""

    steps: frozenset[int] = frozenset()
    every: int = 0  # also every N-th step (0: only ``steps``)
    names: str | None = None  # regex that a site or parameter name must fully match
    phases: frozenset[Phase] = field(default_factory=lambda: frozenset(Phase))

    def wants(self, step: int, name: str, phase: Phase) -> bool:
        if not (step in self.steps or (self.every > 0 and step % self.every == 0)):
            return False
        if phase not in self.phases:
            return False
        return self.names is None or re.fullmatch(self.names, name) is not None

    @property
    def active(self) -> bool:
        return bool(self.steps) or self.every > 0


@dataclass(frozen=True)
class RunInfo:
    """Who wrote the run: the header's identity and pairing fields."""

    node_label: str  # the machine, e.g. "node-7": what reports name
    config: Mapping[str, Any] = field(default_factory=dict)  # any JSON-like mapping (tracer.config_fingerprint)
    seed: int = 0
    data_order_fingerprint: str = ""  # what fixes the order of the data; runs pair only if equal
    role: str = "train"  # "train", "finetune", "replay", ...
    run_id: str | None = None  # None: a fresh random id
    extra: Mapping[str, Any] = field(default_factory=dict)  # role-specific header fields

    def __post_init__(self) -> None:
        _check_types(
            self,
            {
                "node_label": str,
                "config": Mapping,
                "seed": int,
                "data_order_fingerprint": str,
                "role": str,
                "run_id": (str, type(None)),
                "extra": Mapping,
            },
        )


@dataclass(frozen=True)
class TraceOptions:
    """What the Tracer records, and how it writes it."""

    sites: SiteSpec = None  # regex over module paths, or modules; None: attention/MLP of every block
    capture: CapturePolicy = CapturePolicy()  # full tensors to keep besides the fingerprints
    activations: bool = True  # each site's output and input gradient
    gradients: bool = True  # every parameter gradient before the optimizer step
    parameters: bool = True  # every parameter after the optimizer step
    collectives: bool = True  # inputs and outputs of collectives that report to tracer.collectives
    segment_bytes: int = 64 << 20  # roll log segments at this size
    max_pending_chunks: int = 64  # 256 KiB chunks queued for the I/O thread before training waits

    def __post_init__(self) -> None:
        if isinstance(self.sites, list):
            object.__setattr__(self, "sites", tuple(self.sites))
        _check_types(
            self,
            {
                "sites": (str, tuple, type(None)),
                "capture": CapturePolicy,
                "activations": bool,
                "gradients": bool,
                "parameters": bool,
                "collectives": bool,
                "segment_bytes": int,
                "max_pending_chunks": int,
            },
        )
        if isinstance(self.sites, tuple) and not all(isinstance(m, nn.Module) for m in self.sites):
            raise ConfigError("TraceOptions.sites: a list of sites must hold modules (nn.Module); or pass a regex")
        for name in ("segment_bytes", "max_pending_chunks"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TraceOptions.{name} = {getattr(self, name)}: must be > 0")

    def to_dict(self) -> dict[str, Any]:
        """JSON data that `from_dict` reads back; sites must be a regex or None."""
        if self.sites is not None and not isinstance(self.sites, str):
            raise ConfigError("TraceOptions.sites: only a regex (or None) can be passed on as JSON, not modules")
        c = self.capture
        phases = sorted(p.name.lower() for p in c.phases)
        capture = {"steps": sorted(c.steps), "every": c.every, "names": c.names, "phases": phases}
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "capture"}, "capture": capture}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "trace options") -> TraceOptions:
        """Read `to_dict`'s data; unknown keys fail, naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"{source}: unknown trace option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        values = dict(d)
        if "capture" in values:
            c = dict(values["capture"])
            phases = c.get("phases")
            try:
                values["capture"] = CapturePolicy(
                    steps=frozenset(c.get("steps", ())),
                    every=c.get("every", 0),
                    names=c.get("names"),
                    phases=frozenset(Phase) if phases is None else frozenset(Phase[p.upper()] for p in phases),
                )
            except KeyError as e:
                names = [p.name.lower() for p in Phase]
                raise ConfigError(f"{source}: capture phase {e} is not one of {names}") from None
        return cls(**values)


def _check_types(obj: Any, types: Mapping[str, type | tuple[type, ...]]) -> None:
    for name, expected in types.items():
        value = getattr(obj, name)
        wrong_bool = type(value) is bool and expected is int
        if not isinstance(value, expected) or wrong_bool:
            want = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
            found = type(value).__name__
            raise ConfigError(f"{type(obj).__name__}.{name} = {value!r:.60}: must be {want}, found {found}")
