"""The diff tables of a real recorded pair against an independent computation: the reference reader
(`LogReader`, record by record) and a join of plain Python dicts, with the rules of analysis/SCHEMA.md."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipelines.arguments import DEFAULT_STEPS_PER_BUCKET
from tests.pipelines.conftest import FAULT_MICROBATCH, FAULT_SITE, FAULT_STEP
from tracer.log import NO_MICROBATCH, EventRecord, LogReader, Phase, TensorRecord, rank_dir

pytestmark = pytest.mark.slow  # runs a Beam job on runs recorded by a session fixture

EVENT_COLUMNS = (
    "rank",
    "step",
    "microbatch",
    "name",
    "phase",
    "occurrence",
    "status",
    "equal",
    "golden_fingerprint",
    "suspect_fingerprint",
    "golden_l2",
    "suspect_l2",
    "golden_absmax",
    "suspect_absmax",
    "golden_nan",
    "suspect_nan",
    "golden_inf",
    "suspect_inf",
    "meta",
    "golden_segment",
    "golden_offset",
    "suspect_segment",
    "suspect_offset",
)
STEP_COLUMNS = (
    "step",
    "events",
    "differing",
    "sites_differing",
    "inputs_differing",
    "grads_differing",
    "params_differing",
    "first_microbatch",
    "first_name",
    "first_phase",
)
ORDER = [Phase.INPUT, Phase.FORWARD, Phase.BACKWARD, Phase.GRAD, Phase.PARAM]  # within a step, microbatch first


def expected_tables(golden: Path, suspect: Path) -> tuple[list[tuple], list[tuple]]:
    """event_diffs and divergence_steps rows of rank 0, from the logs alone."""
    sides = {}
    for side, run in (("golden", golden), ("suspect", suspect)):
        entries = list(LogReader(rank_dir(run, 0)).entries())
        last_step = max(e.record.step for e in entries if isinstance(e.record, EventRecord) and e.record.kind == "step")
        seen: Counter = Counter()
        keyed = {}
        for e in entries:  # log order: occurrence numbers repeated records of one key
            r = e.record
            if isinstance(r, TensorRecord):
                key = (r.step, r.microbatch, r.name, int(r.phase))
                keyed[(*key, seen[key])] = (e, r)
                seen[key] += 1
        sides[side] = (keyed, last_step)
    (g, g_last), (s, s_last) = sides["golden"], sides["suspect"]
    bound = min(g_last, s_last)
    rows, order = [], {}
    for key in set(g) | set(s):
        step, mb, name, phase, occurrence = key
        if step > bound:
            continue
        ge, gr = g.get(key, (None, None))
        se, sr = s.get(key, (None, None))
        equal = gr is not None and sr is not None and gr.fingerprint == sr.fingerprint
        status = "equal" if equal else "differ" if gr and sr else "golden_only" if gr else "suspect_only"
        field = lambda r, f: getattr(r, f) if r is not None else None  # noqa: E731
        # A parameter, and a gradient no microbatch was the last to change, belong to the whole step: null.
        shown = None if Phase(phase) == Phase.PARAM or mb == NO_MICROBATCH else mb
        row = (
            0,
            step,
            shown,
            name,
            Phase(phase).name.lower(),
            occurrence,
            status,
            equal,
            *(field(r, f) for f in ("fingerprint", "l2", "absmax", "nan", "inf") for r in (gr, sr)),
            (gr or sr).meta,
            field(ge, "segment"),
            field(ge, "offset"),
            field(se, "segment"),
            field(se, "offset"),
        )
        rows.append(row)
        first = ge or se
        step_level = Phase(phase) in (Phase.GRAD, Phase.PARAM)
        order[row] = (step, step_level, 0 if step_level else mb, ORDER.index(Phase(phase)), first.segment, first.offset)
    steps = []
    for step in sorted({r[1] for r in rows}):
        mine = sorted((r for r in rows if r[1] == step), key=order.__getitem__)
        differ = [r for r in mine if r[6] != "equal"]
        count = lambda phase, differ=differ: sum(r[4] == phase for r in differ)  # noqa: E731
        sites = {r[3] for r in differ if r[4] in ("forward", "backward")}
        first = differ[0] if differ else None
        steps.append(
            (
                step,
                len(mine),
                len(differ),
                len(sites),
                count("input"),
                count("grad"),
                count("param"),
                *((first[2], first[3], first[4]) if first else (None, None, None)),
            )
        )
    return sorted(rows, key=_sortable), steps


def _sortable(row: tuple) -> tuple:
    return tuple((v is None, v if v is not None else 0) for v in row)


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.parametrize("steps_per_bucket", [DEFAULT_STEPS_PER_BUCKET, 2])
def test_event_diffs_and_frontier_equal_an_independent_join(
    runs, run_diff, tmp_path: Path, steps_per_bucket: int
) -> None:
    run_diff(runs["golden"], runs["hooked"], steps_per_bucket=steps_per_bucket)
    db = tmp_path / "study.duckdb"
    rows, steps = expected_tables(runs["golden"], runs["hooked"])
    got = query(db, f"SELECT {', '.join(EVENT_COLUMNS)} FROM event_diffs")
    assert len(got) == len(rows) > 0 and any(r[6] == "differ" for r in rows)
    assert sorted(got, key=_sortable) == rows
    assert query(db, f"SELECT {', '.join(STEP_COLUMNS)} FROM divergence_steps ORDER BY step") == steps
    (first,) = [s for s in steps if s[2]][:1]
    assert (
        query(db, "SELECT step, microbatch, name, phase FROM first_divergence")
        == [first[:1] + first[-3:]]
        == [(FAULT_STEP, FAULT_MICROBATCH, FAULT_SITE, "forward")]
    )
