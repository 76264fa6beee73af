"""The tolerance map: the places (site, parameter, collective point; phase) whose bits are known to differ
between healthy runs, and the band within which `sdc diff --tolerance MAP` compares them instead of
reporting SDC. ``sdc verify-determinism --report MAP`` measures and writes it (`pipelines.nondeterminism`).

    tolerance = load_tolerance_map(Path("tolerance.json"))     # parsed once; ConfigError names file and field
    tolerance.places[("layers.0.mlp", "forward")].band         # the largest relative stats difference allowed
    write_tolerance_map(Path("tolerance.json"), tolerance)

The file is JSON (docs/incident.md, "The nondeterminism audit")::

    {"format": "sdctrace-tolerance-map", "version": 1, "margin": 2.0,
     "measured": {"runs": ["A", "B"], "steps": [0, 1, 2], "ranks": [0]},
     "places": [{"name": "mix", "phase": "forward", "events": 3, "max_ulps": 192, "ulp_events": 3,
                 "max_rel_diff": 1.1e-7, "max_rel_error": 3.2e-7, "band": 6.4e-7}, ...]}

A place's ``max_ulps`` is the largest distance in units in the last place over the elements of the
events whose full tensors both runs captured (``ulp_events`` of ``events``; null: none was captured, the
ulp band is unknown there), and ``max_rel_error`` the largest size of their element-wise difference
relative to the tensor, the larger of ||a-b||/||a|| and max|a-b|/max|a| (0 where none was captured);
``max_rel_diff`` is the largest relative difference of the logged float32 ``l2`` and ``absmax`` stats. The
diff only has those stats, so ``band`` is what it allows: ``margin`` times the larger of ``max_rel_diff``
and ``max_rel_error``, which bounds how far the stats can move (| ||a|| - ||b|| | <= ||a-b||, and likewise
for the max): `stats_band`. This module
imports neither torch nor Beam, so the audit (sdc) and the diff (pipelines) both read it; `within_band` is
the diff's test of an event against its place's band.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracer.bounded_read import Bounds, read_json
from tracer.errors import ConfigError
from tracer.log.records import Phase

FORMAT, VERSION = "sdctrace-tolerance-map", 1
PHASE_NAMES = tuple(p.name.lower() for p in sorted(Phase))  # as the diff's tables name phases
MAX_BYTES = 64 << 20  # a map of a million places is about 150 MB; refuse far larger files before reading
MAX_PLACES = 1 << 20
MAX_LIST = 1 << 20  # runs, steps, ranks
MAX_NAME = 4096
MAX_ULPS = 1 << 32
MAX_MARGIN = 1e6
STATS_ROUNDING = 4 * 2.0**-24  # the float32 stats' own rounding: a few ulps of the stat


@dataclass(frozen=True)
class TolerancePlace:
    """One place's measured band."""

    name: str  # site, parameter or collective point, as the log names it
    phase: str  # forward, backward, grad, param, input
    events: int  # differing events measured
    max_ulps: int | None  # None: no event's full tensors were captured on both sides (the ulp band is unknown)
    ulp_events: int  # events whose ulps were measured
    max_rel_diff: float  # largest relative difference of the l2/absmax stats
    max_rel_error: float  # largest element-wise difference relative to the tensor (captured events only)
    band: float  # the relative stats difference the diff allows here


@dataclass(frozen=True)
class ToleranceMap:
    """A parsed map: how it was measured, and its places by (name, phase)."""

    runs: tuple[str, ...]
    steps: tuple[int, ...]
    ranks: tuple[int, ...]
    margin: float
    places: Mapping[tuple[str, str], TolerancePlace] = field(default_factory=dict)
    source: str = ""  # the file it was read from ("" when built in memory)


def stats_band(max_rel_diff: float, max_rel_error: float | None, margin: float) -> float:
    """The relative stats difference allowed at a place: ``margin`` times the larger of the measured one and
    the most the measured element-wise difference can move the stats (None: no tensors were captured)."""
    implied = 0.0 if max_rel_error is None else max_rel_error + STATS_ROUNDING
    return margin * max(max_rel_diff, implied)


def within_band(
    tolerance: ToleranceMap,
    names: list[str],
    name: np.ndarray,
    phase: np.ndarray,
    stats: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """Per event (``name``: codes into ``names``; ``phase``: Phase values), whether the golden and suspect stats
    (``stats``: l2, absmax, nan, inf, meta; golden and suspect columns) lie within the band of a place the map
    lists: same meta (dtype and shape) and NaN/Inf counts, l2 and absmax within the band's relative difference.
    A NaN stat lies in no band."""
    lut = np.full((max(len(names), 1), len(PHASE_NAMES)), np.nan)
    for code, n in enumerate(names):
        for p, phase_name in enumerate(PHASE_NAMES):
            if (place := tolerance.places.get((n, phase_name))) is not None:
                lut[code, p] = place.band
    band = lut[name, phase.astype(np.intp)] if len(name) else np.zeros(0)
    rel = np.maximum(*(_relative(*stats[k]) for k in ("l2", "absmax")))
    same = np.ones(len(name), bool)
    for k in ("nan", "inf", "meta"):
        same &= stats[k][0] == stats[k][1]
    with np.errstate(invalid="ignore"):
        return same & (rel <= band)


def _relative(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(a - b) / np.maximum(np.abs(a), np.abs(b))
    return np.where(a == b, 0.0, rel)


def to_json(tolerance: ToleranceMap) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "margin": tolerance.margin,
        "measured": {"runs": list(tolerance.runs), "steps": list(tolerance.steps), "ranks": list(tolerance.ranks)},
        "places": [
            {
                "name": p.name,
                "phase": p.phase,
                "events": p.events,
                "max_ulps": p.max_ulps,
                "ulp_events": p.ulp_events,
                "max_rel_diff": p.max_rel_diff,
                "max_rel_error": p.max_rel_error,
                "band": p.band,
            }
            for p in sorted(tolerance.places.values(), key=lambda p: (p.name, PHASE_NAMES.index(p.phase)))
        ],
    }


def write_tolerance_map(path: Path, tolerance: ToleranceMap) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_json(tolerance), indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_tolerance_map(path: str | Path) -> ToleranceMap:
    """Read and check a map; every error is a ConfigError naming the file, the field and the fix."""
    where = str(path)
    doc = read_json(
        path,
        "tolerance map",
        Bounds(file_bytes=MAX_BYTES, depth=16, text=MAX_NAME),
        "write it again with sdc verify-determinism --report",
        ConfigError,
    )
    return parse_tolerance_map(doc, where)


def parse_tolerance_map(doc: Any, where: str = "tolerance map") -> ToleranceMap:
    """A map's JSON document, checked field by field (bounded sizes and counts)."""
    r = _Reader(where)
    r.mapping(doc, "the document")
    if doc.get("format") != FORMAT:
        r.fail("format", f"{doc.get('format')!r}, expected {FORMAT!r}", "this is not a tolerance map")
    if type(doc.get("version")) is not int or doc.get("version") != VERSION:  # True == 1, yet no version
        r.fail(
            "version",
            f"{doc.get('version')!r}, this sdctrace reads version {VERSION}",
            "measure it again with this version's sdc verify-determinism --report",
        )
    margin = r.number(doc.get("margin"), "margin", 1.0, MAX_MARGIN)
    measured = r.mapping(doc.get("measured"), "measured")
    runs = tuple(
        r.string(x, f"measured.runs[{i}]") for i, x in enumerate(r.items(measured.get("runs"), "measured.runs"))
    )
    steps = tuple(
        r.integer(x, f"measured.steps[{i}]", 0, 1 << 40)
        for i, x in enumerate(r.items(measured.get("steps"), "measured.steps"))
    )
    ranks = tuple(
        r.integer(x, f"measured.ranks[{i}]", 0, 1 << 20)
        for i, x in enumerate(r.items(measured.get("ranks"), "measured.ranks"))
    )
    places: dict[tuple[str, str], TolerancePlace] = {}
    for i, item in enumerate(r.items(doc.get("places"), "places", MAX_PLACES)):
        at = f"places[{i}]"
        p = r.mapping(item, at)
        name = r.string(p.get("name"), f"{at}.name")
        phase = r.string(p.get("phase"), f"{at}.phase")
        if phase not in PHASE_NAMES:
            r.fail(f"{at}.phase", f"{phase!r}", f"use one of {', '.join(PHASE_NAMES)}")
        if (name, phase) in places:
            r.fail(f"{at}", f"{name!r} {phase} listed twice", "keep one entry per place")
        ulps = p.get("max_ulps")
        places[(name, phase)] = _consistent(
            r,
            at,
            margin,
            TolerancePlace(
                name,
                phase,
                r.integer(p.get("events"), f"{at}.events", 0, 1 << 62),
                None if ulps is None else r.integer(ulps, f"{at}.max_ulps", 0, MAX_ULPS),
                r.integer(p.get("ulp_events"), f"{at}.ulp_events", 0, 1 << 62),
                r.number(p.get("max_rel_diff"), f"{at}.max_rel_diff", 0.0, math.inf),
                r.number(p.get("max_rel_error"), f"{at}.max_rel_error", 0.0, math.inf),
                r.number(p.get("band"), f"{at}.band", 0.0, math.inf),
            ),
        )
    return ToleranceMap(runs, steps, ranks, margin, places, where)


def _consistent(r: _Reader, at: str, margin: float, place: TolerancePlace) -> TolerancePlace:
    """``place`` when its fields agree with each other and with ``margin`` as the audit writes them: no more events
    measured in ulps than differed, ``max_ulps`` null exactly when none was, and a band no wider than ``margin``
    times the measured difference (`stats_band`): a wider band would excuse differences nobody measured."""
    if place.ulp_events > place.events:
        r.fail(f"{at}.ulp_events", f"{place.ulp_events} of {place.events} events", "at most every differing event")
    if (place.max_ulps is None) != (place.ulp_events == 0):
        r.fail(f"{at}.max_ulps", f"{place.max_ulps!r} with ulp_events {place.ulp_events}", "null exactly when 0")
    allowed = stats_band(place.max_rel_diff, place.max_rel_error, margin)
    if place.band > allowed * (1 + 1e-9):
        r.fail(
            f"{at}.band",
            f"{place.band!r}, wider than margin x the measured difference ({allowed:.6g})",
            "a band is what the audit measured, times the margin",
        )
    return place


def measured_on(tolerance: ToleranceMap, run: str | Path) -> str | None:
    """The run of ``tolerance.runs`` that is ``run`` itself (the same folder, or the same path as written), or
    None. A map measured on the suspect run would take the suspect's own fault for nondeterminism."""
    for measured in tolerance.runs:
        if str(measured) == str(run):
            return measured
        try:
            if Path(measured).exists() and Path(run).exists() and Path(measured).samefile(run):
                return measured
        except OSError:
            continue
    return None


def warn_self_measured(tolerance: ToleranceMap, suspect: str | Path) -> str | None:
    """Warn (one line, naming the map and the run) when ``tolerance`` was measured on ``suspect`` itself: its bands
    may hide the suspect's own fault. The warning's text, or None. (Diffing the audited pair itself is how a map is
    checked, so it is a warning, never silent, not a refusal.)"""
    same = measured_on(tolerance, suspect)
    if same is None:
        return None
    text = (
        f"{tolerance.source}: measured.runs names {same}, the suspect run itself: a difference within its bands is "
        "counted within_tolerance, not SDC, so a fault of the suspect's may hide there; for a verdict on the "
        "suspect, measure the map on two healthy runs (sdc verify-determinism --report MAP)"
    )
    warnings.warn(text, SelfMeasuredWarning, stacklevel=2)
    return text


class SelfMeasuredWarning(UserWarning):
    """A tolerance map was measured on the run it is used to diff."""


class _Reader:
    """Field checks that raise one ConfigError: file, field, what was found, the fix."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, name: str, found: str, fix: str) -> None:
        raise ConfigError(
            f"{self.where}: {name}: {found}; {fix} (or measure the map again with sdc verify-determinism --report)"
        )

    def mapping(self, v: Any, name: str) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            self.fail(name, f"{type(v).__name__}", "expected a JSON object")
        return v

    def items(self, v: Any, name: str, limit: int = MAX_LIST) -> list[Any]:
        if not isinstance(v, list):
            self.fail(name, f"{type(v).__name__}", "expected a JSON list")
        if len(v) > limit:
            self.fail(name, f"{len(v):,} entries", f"at most {limit:,} are read")
        return v

    def string(self, v: Any, name: str) -> str:
        if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
            self.fail(name, f"{v!r:.80}", f"expected a string of 1..{MAX_NAME} characters")
        return v

    def integer(self, v: Any, name: str, lo: int, hi: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.fail(name, f"{v!r:.80}", f"expected an integer in {lo}..{hi}")
        return v

    def number(self, v: Any, name: str, lo: float, hi: float) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and lo <= v <= hi):
            self.fail(name, f"{v!r:.80}", f"expected a finite number in {lo:g}..{hi:g}")
        return float(v)
