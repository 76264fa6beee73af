"""The nondeterminism audit behind ``sdc verify-determinism --report``: every place (site, gradient, parameter,
collective point; phase) whose bits differ between two runs of one node, with ulp distances, and the tolerance
map (`pipelines.tolerance`) `sdc diff --tolerance` reads.

    audit = audit_runs(Path("verify/a"), Path("verify/b"))     # the two runs must pair (tracer.pairing)
    print("\\n".join(audit_table(audit)))
    write_tolerance_map(Path("tolerance.json"), audit.tolerance)

Records are compared rank by rank in log order, as `tracer.compare.compare_runs` does. Where both runs kept
an event's full tensor (the blob store, `--capture-steps`) the distance is measured element by element in
units in the last place; elsewhere only the logged float32 ``l2``/``absmax`` stats are compared (their
relative difference) and the place's ulp band is unknown. Reads logs and blobs only: no Beam.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from pipelines.tolerance import PHASE_NAMES, ToleranceMap, TolerancePlace, stats_band
from tracer.blobs import BlobStore
from tracer.collectives import OPS
from tracer.errors import ValidationError
from tracer.float_bits import ordered
from tracer.log import LogReader, TensorRecord, list_ranks, rank_dir
from tracer.pairing import pairing_differences, setting_warnings

DEFAULT_MARGIN = 2.0
_COLLECTIVE = re.compile(r".*\.(" + "|".join(OPS) + r")\.(in|out)")
_BITS = {
    torch.float32: (torch.int32, 32),
    torch.float64: (torch.int64, 64),
    torch.bfloat16: (torch.int16, 16),
    torch.float16: (torch.int16, 16),
}


@dataclass(frozen=True)
class AuditedPlace:
    """One place whose bits differed, and by how much."""

    kind: str  # site, gradient, parameter, collective, input
    place: TolerancePlace
    first_step: int
    last_step: int


@dataclass(frozen=True)
class Audit:
    """Two runs compared event by event: counts, the differing places, where the runs stopped lining up."""

    events: int  # tensor events compared
    steps: int
    differing: int  # events whose bits differ
    places: tuple[AuditedPlace, ...]
    tolerance: ToleranceMap
    warnings: tuple[str, ...]  # bit-changing settings that differ without stopping the pair
    misaligned: str | None  # the runs recorded different events from here on (not compared further)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The size of ``a - b`` relative to ``a``: the larger of ||a-b||/||a|| and max|a-b|/max|a| (float64),
    what bounds how far the l2 and absmax stats can move between the two."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    d = (a - b).abs()
    if not len(d) or not bool(d.any()):
        return 0.0
    ratios = (d.norm() / a.norm(), d.max() / a.abs().max())
    return max(float(r) if math.isfinite(float(r)) else math.inf for r in ratios)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The largest distance in units in the last place between two same-shaped float tensors' elements (0 and
    -0 are one value); None for other dtypes, other shapes, or a NaN on either side."""
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype not in _BITS:
        return None
    if bool(torch.isnan(a).any()) or bool(torch.isnan(b).any()):
        return None
    if a.numel() == 0:
        return 0
    int_type, width = _BITS[a.dtype]

    def positions(t: torch.Tensor) -> torch.Tensor:
        return ordered(t.contiguous().reshape(-1).view(int_type), width)

    return int((positions(a) - positions(b)).abs().max())


def place_kind(name: str, phase: str) -> str:
    if _COLLECTIVE.fullmatch(name):
        return "collective"
    return {"forward": "site", "backward": "site", "grad": "gradient", "param": "parameter"}.get(phase, phase)


def audit_runs(a: Path, b: Path, *, margin: float = DEFAULT_MARGIN) -> Audit:
    """Compare every tensor event of runs ``a`` and ``b`` (same ranks, pairing headers)."""
    ranks = list_ranks(a)
    if ranks != list_ranks(b):
        raise ValidationError(f"{a} has ranks {ranks} but {b} has ranks {list_ranks(b)}; record both alike")
    readers = [(LogReader(rank_dir(a, r)), LogReader(rank_dir(b, r))) for r in ranks]
    problems, warnings = [], []
    for ra, rb in readers:
        problems += [d for d in pairing_differences(ra.header, rb.header) if d not in problems]
        warnings += [w for w in setting_warnings(ra.header, rb.header) if w not in warnings]
    if problems:
        raise ValidationError(f"{a} and {b} are not two runs of one config and node setup: " + "; ".join(problems))
    blobs = (BlobStore(a), BlobStore(b))
    acc: dict[tuple[str, str], _Band] = {}
    events, differing, steps, misaligned = 0, 0, set(), None
    for rank, (ra, rb) in zip(ranks, readers):
        left = (r for r in ra.records() if isinstance(r, TensorRecord))
        right = (r for r in rb.records() if isinstance(r, TensorRecord))
        for x in left:
            y = next(right, None)
            if y is None:
                break
            if (x.step, x.microbatch, x.name, x.phase) != (y.step, y.microbatch, y.name, y.phase):
                misaligned = misaligned or (
                    f"rank {rank}, step {x.step}: {x.name} {x.phase.name.lower()} vs {y.name} {y.phase.name.lower()}"
                )
                break
            events += 1
            steps.add(x.step)
            if x.fingerprint != y.fingerprint:
                differing += 1
                key = (x.name, PHASE_NAMES[int(x.phase)])
                acc.setdefault(key, _Band()).add(x, y, _tensors(blobs, x, y))
    places = tuple(band.place(key, margin) for key, band in sorted(acc.items()))
    tolerance = ToleranceMap(
        (str(a), str(b)),
        tuple(sorted(steps)),
        tuple(ranks),
        margin,
        {(p.place.name, p.place.phase): p.place for p in places},
    )
    return Audit(events, len(steps), differing, places, tolerance, tuple(warnings), misaligned)


def _tensors(
    blobs: tuple[BlobStore, BlobStore], x: TensorRecord, y: TensorRecord
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both runs' full tensors of the event, where both captured it."""
    if x.fingerprint not in blobs[0] or y.fingerprint not in blobs[1]:
        return None
    return blobs[0].get(x.fingerprint), blobs[1].get(y.fingerprint)


def _relative(u: float, v: float) -> float:
    """|u - v| relative to the larger; 0 where equal, and 0 for non-finite stats (the diff never excuses those:
    it compares NaN and Inf counts exactly and a NaN difference lies in no band)."""
    if u == v or not (math.isfinite(u) and math.isfinite(v)):
        return 0.0
    return abs(u - v) / max(abs(u), abs(v))


class _Band:
    """A place's differing events, accumulated."""

    def __init__(self) -> None:
        self.events, self.ulp_events = 0, 0
        self.max_ulps: int | None = None
        self.max_error: float | None = None
        self.max_rel, self.first, self.last = 0.0, None, None

    def add(self, x: TensorRecord, y: TensorRecord, tensors: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.events += 1
        self.first = x.step if self.first is None else min(self.first, x.step)
        self.last = x.step if self.last is None else max(self.last, x.step)
        self.max_rel = max(self.max_rel, _relative(x.l2, y.l2), _relative(x.absmax, y.absmax))
        if tensors is None:
            return
        self.max_error = max(self.max_error or 0.0, relative_error(*tensors))
        if (ulps := ulp_distance(*tensors)) is not None:
            self.ulp_events += 1
            self.max_ulps = max(self.max_ulps or 0, ulps)

    def place(self, key: tuple[str, str], margin: float) -> AuditedPlace:
        name, phase = key
        # An infinite relative error (a NaN or Inf moved) has no band: listed, never excused by the diff.
        finite = self.max_error is None or math.isfinite(self.max_error)
        band = stats_band(self.max_rel, self.max_error, margin) if finite else 0.0
        error = self.max_error if self.max_error is not None and finite else 0.0
        tp = TolerancePlace(name, phase, self.events, self.max_ulps, self.ulp_events, self.max_rel, error, band)
        return AuditedPlace(place_kind(name, phase), tp, self.first or 0, self.last or 0)


def audit_table(audit: Audit, limit: int = 200) -> list[str]:
    """The audit as printed lines: a summary, then one row per differing place (at most ``limit``)."""
    lines = [
        f"{audit.events:,} tensor events over {audit.steps} steps compared; {audit.differing:,} differ at "
        f"{len(audit.places)} place(s)"
    ]
    lines += [f"warning: setting differs: {w}" for w in audit.warnings]
    if audit.misaligned:
        lines.append(f"the runs recorded different events from {audit.misaligned}: not compared past it")
    if not audit.places:
        return lines
    lines.append(
        f"{'kind':<11} {'phase':<9} {'events':>6} {'steps':>9} {'max ulps':>10} {'max rel diff':>12} {'band':>9}  name"
    )
    for p in audit.places[:limit]:
        t = p.place
        ulps = "unknown" if t.max_ulps is None else f"{t.max_ulps:,}"
        steps = f"{p.first_step}..{p.last_step}"
        lines.append(
            f"{p.kind:<11} {t.phase:<9} {t.events:>6} {steps:>9} {ulps:>10} {t.max_rel_diff:>12.3g} "
            f"{t.band:>9.3g}  {t.name}"
        )
    if len(audit.places) > limit:
        lines.append(f"... and {len(audit.places) - limit} more place(s) in the JSON map")
    return lines
