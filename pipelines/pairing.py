"""Which runs may be compared, under which id, and over which steps.

Two runs pair when every header field that decides the bits of a training step
agrees (`tracer.pairing.PAIRING_FIELDS`, rank by rank) and they have the same ranks. Their length
may differ: per rank, the comparison stops at the last step both runs completed
(`ComparisonBounds`). A replay log must also match the golden run, and say it is one. A
fine-tune's twin must match the golden fine-tune in everything but the shuffle seed. A
baseline suspect (`sdc diff --baseline`) is golden's shuffle-seed twin: it may differ from
golden in the data order and nothing else; a pretraining twin's drift is the baseline other
suspects' drift is read against, and every twin's loss spikes are the null of the spike
finding (RQ3). A bit-changing setting that differs but changes no bits on
the runs' device (`tracer.bit_settings`: an NCCL variable on a CPU run) does not stop a pair:
`validate_pair` returns one warning line for it, naming the setting and both values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam

from pipelines.log_source import DIFFED, RankInfo, RunLayout
from pipelines.tables import TABLES, named
from pipelines.tagged_outputs import split
from tracer.errors import ValidationError
from tracer.log import RunHeader
from tracer.pairing import baseline_differences, pairing_differences, setting_warnings, twin_differences

BOUNDS = "bounds"
LOST = "lost"  # (rank, ((first, last) step, ...)): steps corruption made unknown on either side


def differences(
    a: RunLayout,
    b: RunLayout,
    *,
    subset: bool = False,
    compare: Callable[[RunHeader, RunHeader], list[str]] = pairing_differences,
) -> list[str]:
    """Every field that stops `a` and `b` from pairing, as ``field: a-value vs b-value`` (any rank).

    `subset`: `b` may hold fewer ranks than `a` (a replay log of some ranks). `compare`: the header check.
    """
    out: list[str] = []
    if sorted(a.ranks) != sorted(b.ranks) and not (subset and set(b.ranks) <= set(a.ranks)):
        out.append(f"ranks: {sorted(a.ranks)} vs {sorted(b.ranks)}")
    for rank in sorted(set(a.ranks) & set(b.ranks)):
        out += [d for d in compare(a.ranks[rank].header, b.ranks[rank].header) if d not in out]
    return out


def validate_pair(
    golden: RunLayout,
    suspect: RunLayout,
    replays: Iterable[RunLayout] = (),
    twin: RunLayout | None = None,
    *,
    baseline: bool = False,
) -> list[str]:
    """Raise one ValidationError listing every differing field of every run that does not fit; with `baseline`
    the suspect must be golden's shuffle-seed twin (pretraining's, or a fine-tune's). Return the warnings:
    golden's and the suspect's bit-changing settings that differ without stopping the pair
    (`tracer.pairing.setting_warnings`)."""
    problems = []
    if baseline:
        diffs = differences(golden, suspect, compare=baseline_differences)
        if diffs:
            problems.append(
                f"baseline {suspect.path} is not the shuffle-seed twin of golden {golden.path} (record it "
                "with golden's config and data.shuffle_seed changed, no faults): " + "; ".join(diffs)
            )
    else:
        diffs = differences(golden, suspect)
        if diffs:
            problems.append(f"golden {golden.path} and suspect {suspect.path} do not pair: " + "; ".join(diffs))
    for replay in replays:
        diffs = differences(golden, replay, subset=True)
        roles = sorted({r.header.role for r in replay.ranks.values()})
        if roles != ["replay"]:
            diffs.append(f"role: expected 'replay', found {', '.join(map(repr, roles))}")
        if diffs:
            problems.append(f"replay log {replay.path} does not fit golden {golden.path}: " + "; ".join(diffs))
    if twin is not None:
        diffs = differences(golden, twin, compare=twin_differences)
        if diffs:
            problems.append(
                f"twin {twin.path} is not the shuffle-seed twin of golden {golden.path}: " + "; ".join(diffs)
            )
    if problems:
        raise ValidationError(
            " | ".join(problems) + ". Record the runs with the same config, seed and data order "
            "(only run.steps may differ), pass replay logs written from this pair, and a twin fine-tuned from "
            "the same run with the same settings but --shuffle-seed."
        )
    return differences(golden, suspect, compare=setting_warnings)


def pair_id(golden: RunLayout, suspect: RunLayout) -> str:
    """Deterministic from both runs' per-rank run ids: loading the same pair again replaces its rows."""
    layout = ";".join(
        f"{rank}:{golden.ranks[rank].header.run_id}:{suspect.ranks[rank].header.run_id}"
        for rank in sorted(golden.ranks)
    )
    return hashlib.sha256(layout.encode()).hexdigest()[:16]


def last_compared_step(golden: RankInfo, suspect: RankInfo) -> int | None:
    """The last step both runs completed on this rank; None if either has none."""
    if golden.last_step is None or suspect.last_step is None:
        return None
    return min(golden.last_step, suspect.last_step)


class ComparisonBounds(beam.PTransform):
    """RankInfo of both runs -> {BOUNDS: (rank, last compared step), LOST: (rank, lost step ranges of either
    side), TABLES: pair_ranks}."""

    def __init__(self, run_ids: dict[tuple[str, int], str]) -> None:
        super().__init__()
        self.run_ids = run_ids  # (side, rank) -> run id

    def expand(self, infos: beam.PCollection) -> dict[str, beam.PCollection]:
        bounds = (
            infos
            | "Golden and suspect by rank" >> beam.FlatMap(lambda i: [(i.rank, i)] if i.side in DIFFED else [])
            | "Group ranks" >> beam.GroupByKey()
            | "Bounds" >> beam.ParDo(_Bounds(self.run_ids))
        )
        return split(bounds, (BOUNDS, LOST, TABLES), "Compared")


class _Bounds(beam.DoFn):
    def __init__(self, run_ids: dict[tuple[str, int], str]) -> None:
        self.run_ids = run_ids

    def process(self, element: tuple[int, Iterable[RankInfo]]) -> Iterator[Any]:
        rank, infos = element
        by_side = {i.side: i for i in infos}
        golden, suspect = by_side.get("golden"), by_side.get("suspect")
        bound = last_compared_step(golden, suspect) if golden and suspect else None
        if bound is not None:
            yield BOUNDS, (rank, bound)
        lost = tuple(r for i in (golden, suspect) if i is not None for r in i.lost_steps)
        if lost:
            yield LOST, (rank, lost)
        yield (
            TABLES,
            named(
                "pair_ranks",
                [
                    {
                        "rank": rank,
                        "golden_run_id": self.run_ids.get(("golden", rank)),
                        "suspect_run_id": self.run_ids.get(("suspect", rank)),
                        "golden_last_step": golden.last_step if golden else None,
                        "suspect_last_step": suspect.last_step if suspect else None,
                        "compared_through": bound,
                        "golden_status": golden.status if golden else None,
                        "suspect_status": suspect.status if suspect else None,
                        "lost_steps": None if bound is None else lost_step_count(lost, bound),
                    }
                ],
            ),
        )


def in_lost_steps(step: Any, lost: Iterable[tuple[int | None, int | None]]) -> Any:
    """Whether each step (an int or a numpy array) lies in a lost range; None bounds are open."""
    hit = step != step
    for lo, hi in lost:
        hit = hit | (((step >= lo) if lo is not None else True) & ((step <= hi) if hi is not None else True))
    return hit


def lost_step_count(lost: Iterable[tuple[int | None, int | None]], bound: int) -> int:
    """How many of the compared steps 0..bound corruption made unknown."""
    return sum(bool(in_lost_steps(step, lost)) for step in range(bound + 1))
