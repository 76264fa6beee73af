"""The few lines `sdc diff` ends with: what one pair's tables say, read through the named queries.

    for line in summarize_pair("study.duckdb", pair_id):
        print(line)

The totals (events compared and differing, those within a tolerance map's band, runs' status, lost steps), the first
divergence per rank in execution order, parameter drift and loss spikes, and per
fine-tuning task the accuracies and the suspect's disagreement with golden (RQ3). The
database is opened read-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis import queries


def summarize_pair(db: str | Path, pid: str) -> list[str]:
    """A few lines on what the pair's tables say, from the named queries (the database opened read-only, once)."""
    with queries.LIBRARY.session(db) as session:
        return _summary_lines(session, pid)


def _summary_lines(session: queries.Session, pid: str) -> list[str]:
    db = session.db_path
    (totals,) = _pair_rows(session, "summary_totals", pid)
    if totals["compared_through"] is None:
        return [_nothing_compared(session, pid, totals), f"  tables: {db} (pair_id = '{pid}')"]
    result = (
        f"result: {totals['events_compared']:,} events compared through step {totals['compared_through']}; "
        f"{totals['events_differing']:,} differ"
    )
    lines = [result]
    for t in _pair_rows(session, "SELECT * FROM within_tolerance", pid):  # sdc diff --tolerance
        lines.append(
            f"  {t['events']:,} of them within the tolerance map's band at {t['places']} place(s), "
            f"not SDC; {totals['events_differing'] - t['events']:,} differ beyond it or unlisted"
        )
    if totals["lost_steps"]:
        lines.append(
            f"  {totals['lost_steps']} compared step(s) lost to corruption (golden {totals['golden_status']}, "
            f"suspect {totals['suspect_status']}): no divergence is reported there; see table lost_ranges"
        )
    elif (totals["golden_status"], totals["suspect_status"]) != ("complete", "complete"):
        lines.append(f"  runs: golden {totals['golden_status']}, suspect {totals['suspect_status']}")
    firsts = _pair_rows(session, "rq1_first_divergence_by_rank", pid)  # in execution order across ranks
    for r in firsts:
        lines.append(_first_line(r, alone=len(firsts) == 1))
    tied = [r["rank"] for r in firsts if r["divergence_order"] == 1 and r["tied"]]
    if tied:
        lines.append(
            f"  ranks {', '.join(map(str, tied))} tie: they first differ at the same point, which a collective "
            "reached on all of them (an output after an all-reduce), so no record tells which rank the corruption "
            "entered on; trace a site before the collective (--sites, TraceOptions(sites=...)) to tell"
        )
    drift, spikes = totals["max_drift"], totals["loss_spikes"]
    lines.append(
        f"  max parameter drift {drift:.3g}; {spikes} loss spike(s)"
        if drift is not None
        else f"  no checkpoint pair for drift; {spikes} loss spike(s)"
    )
    lines += _finetune_lines(session, pid, totals["suspect_run_id"])
    lines.append(f"  tables: {db} (pair_id = '{pid}')")
    return lines


def _nothing_compared(session: queries.Session, pid: str, totals: dict[str, Any]) -> str:
    """The result of a pair with no step both runs completed on any rank: which run completed none."""
    ranks = _pair_rows(session, "SELECT * FROM pair_ranks", pid)
    sides = [s for s in ("golden", "suspect") if all(r[f"{s}_last_step"] is None for r in ranks)]
    who = " and ".join(f"the {s}" for s in sides) or "the runs"
    return (
        f"result: no steps to compare: {who} completed no step (golden {totals['golden_status']}, "
        f"suspect {totals['suspect_status']}), so no divergence is reported"
    )


def _first_line(r: dict[str, Any], *, alone: bool) -> str:
    """One rank's first divergence, marked as the rank that went first, tied with others at the first point, or
    its place in the order."""
    if alone:
        order = ""
    elif r["divergence_order"] == 1:
        order = " (tied)" if r["tied"] else " (went first)"
    else:
        order = f" (#{r['divergence_order']})"
    mb = "the whole step" if r["microbatch"] is None else f"microbatch {r['microbatch']}"
    shard = "" if r["slice"] is None else f" (shard {r['slice']} of {'x'.join(map(str, r['global_shape']))})"
    stage = "" if r.get("stage") is None else f" (stage {r['stage']})"
    return (
        f"  first divergence: rank {r['rank']}{stage}{order}, step {r['step']}, {mb}, {r['phase']} {r['name']}{shard}"
    )


def _finetune_lines(session: queries.Session, pid: str, suspect_run_id: str) -> list[str]:
    """Per task, for fine-tunes: the final accuracies, collapses, and suspect vs twin disagreement (RQ3)."""
    collapsed = {
        r["task"]
        for r in session.run("rq3_finetune_accuracy").records()
        if r["collapsed"] and r["run_id"] == suspect_run_id
    }
    lines = []
    for r in sorted(_pair_rows(session, "rq3_finetune_disagreement", pid), key=lambda r: r["task"]):
        task, twin, baseline = r["task"], r["twin_accuracy"], r["baseline_disagreement"]
        twin_text = f", twin {twin:.0%}" if twin is not None else ""
        base_text = f" (twin baseline {baseline:.0%})" if baseline is not None else " (no --twin, no baseline)"
        lines.append(
            f"  fine-tune {task}: accuracy golden {r['golden_accuracy']:.0%}, "
            f"suspect {r['suspect_accuracy']:.0%}{' COLLAPSED' if task in collapsed else ''}{twin_text}; "
            f"answers differ on {r['disagreement']:.0%}{base_text}"
        )
    return lines


def _pair_rows(session: queries.Session, query: str, pid: str) -> list[dict[str, Any]]:
    """The rows of a named query or a SELECT (they cover every pair) that belong to pair `pid`."""
    return [r for r in session.run(query).records() if r["pair_id"] == pid]
