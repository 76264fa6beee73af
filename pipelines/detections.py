"""Per rank: the first divergence, and fault ground truth against what detected it.

The rules (analysis/SCHEMA.md repeats them for readers of the tables):

- A `fault` event is located at a traced site (`pipelines.events.fault_units`) at the
  same step, microbatch and phase ("forward": the site's output, "backward": the
  gradient w.r.t. its input).
- Fingerprint divergence as a detector, over traced site events (FORWARD and
  BACKWARD records compared, `pipelines.tensor_diff`): tp = a faulted unit that differs,
  fn = a faulted unit that does not, fp = an unfaulted unit that differs at a step
  before the rank's first fault (nothing injected explains it), propagated = an
  unfaulted unit that differs from the first faulted step on, tn = the rest.
- ABFT as a detector, per (side, rank, step, microbatch, site, phase, op) that ABFT
  checked: flagged if any check there says "flag", faulted if a fault of the same
  side has that key. The schema gives neither event a call index, so several calls
  of one op in one site and microbatch form one unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam

from pipelines.events import AbftCheck, Fault
from pipelines.tables import named
from pipelines.tensor_diff import FIRST, BucketFindings, earliest

FAULTS, ABFT, SCORES = "faults", "abft", "detection_scores"
_OUTCOMES = ("tp", "fp", "fn", "tn")


class RankFindings(beam.PTransform):
    """FINDINGS of `DiffTensors`, with every `Fault` and `AbftCheck` -> TABLES: first_divergence, faults,
    abft and detection_scores, one set per rank."""

    def __init__(self, faults: beam.PCollection, checks: beam.PCollection) -> None:
        super().__init__()
        self.faults, self.checks = faults, checks

    def expand(self, findings: beam.PCollection) -> beam.PCollection:
        return (
            (
                findings,
                self.faults | "Key faults" >> beam.Map(lambda f: (f.rank, ("fault", f))),
                self.checks | "Key checks" >> beam.Map(lambda c: (c.rank, ("abft", c))),
            )
            | "Everything of a rank" >> beam.Flatten()
            | "Group by rank" >> beam.GroupByKey()
            | "Score rank" >> beam.FlatMapTuple(rank_tables)
        )


def rank_tables(rank: int, tagged: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """One rank's first_divergence, faults, abft and detection_scores rows, as (table, pa.Table)."""
    buckets: list[BucketFindings] = []
    faults: list[Fault] = []
    checks: list[AbftCheck] = []
    for tag, value in tagged:
        {"bucket": buckets, "fault": faults, "abft": checks}[tag].append(value)
    first = earliest(b.first for b in buckets)
    if first is not None:
        yield named(FIRST, [first[1]])
    scores = []
    if buckets:
        units, tp, fp, fn, tn, propagated = (sum(col) for col in zip(*(b.scores for b in buckets)))
        scores.append(
            {
                "rank": rank,
                "detector": "fingerprint",
                "side": "pair",
                "units": units,
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "tn": tn,
                "propagated": propagated,
            }
        )
    flagged: dict[tuple[Any, ...], bool] = {}
    for c in checks:
        flagged[c.unit] = flagged.get(c.unit, False) or c.verdict == "flag"
    faulted = {f.unit for f in faults}
    hits = {fault_id: hit for b in buckets for fault_id, hit in b.fault_hits}
    if faults:
        no_hit = {"traced_site": None, "fingerprint_detected": None}
        yield named(
            FAULTS, [{**f._asdict(), **hits.get(f.id, no_hit), "abft_flagged": flagged.get(f.unit)} for f in faults]
        )
    if checks:
        yield named(
            ABFT,
            [
                {**c._asdict(), "faulted": c.unit in faulted, "outcome": outcome(c.unit in faulted, flagged[c.unit])}
                for c in checks
            ],
        )
    by_side: dict[str, list[int]] = {}
    for unit, flag in flagged.items():
        counts = by_side.setdefault(unit[0], [0] * (1 + len(_OUTCOMES)))
        counts[0] += 1
        counts[1 + _OUTCOMES.index(outcome(unit in faulted, flag))] += 1
    for side, (units, tp, fp, fn, tn) in sorted(by_side.items()):
        scores.append(
            {
                "rank": rank,
                "detector": "abft",
                "side": side,
                "units": units,
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "tn": tn,
                "propagated": 0,
            }
        )
    if scores:
        yield named(SCORES, scores)


def outcome(faulted: bool, flagged: bool) -> str:
    return ("tp" if flagged else "fn") if faulted else ("fp" if flagged else "tn")
