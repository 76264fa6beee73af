"""Recovery: for the rows whose outcome the fault model fixes, what the tool measured beside what was injected.

    rec = severity(LIBRARY.run(db, "rq1_fleet_nodes").records(), profiles)
    rec.beside   # "node-03 1.4e-05 vs 3.34e-05 injected; ..."
    rec.error    # "measured / injected: median factor 2.4 (0.38 decades)"

Rows 1-7 and 15 of the reproduction table ask about what the fault model draws (rates, bursts,
sizes, placement, the scripted destroyer): their verdict says whether the study's finding is
*consistent* with what was injected, and this module says how well the tool recovered it: per
node the measured quantity beside the ground truth the emulator logged (its fault events, the
`faults` table; the scripted destroyer from the recorded profiles, `rq1_fleet_profiles`), and
the recovery error. Each function takes its row's query rows and the fleet's fault rules.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from analysis.reproduction_rules import Rows, fleet_nodes, is_fleet_node, learnt_by_all


@dataclass(frozen=True)
class Recovery:
    beside: str  # per node: measured beside injected
    error: str  # the recovery error, in words


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _factors(pairs: list[tuple[float | None, float | None]]) -> str:
    """The median factor between measured and injected over the pairs with both finite and positive."""
    logs = [
        abs(math.log10(m / i))
        for m, i in pairs
        if m is not None and i is not None and 0 < m < math.inf and 0 < i < math.inf
    ]
    if not logs:
        return "no node with both a measured and an injected value"
    d = statistics.median(logs)
    return f"measured / injected: median factor {10**d:.3g} ({d:.2g} decades) over {len(logs)} node(s)"


def silence(rows: Rows, profiles: Rows) -> Recovery:
    """Row 1: each node silent as measured (no mismatching call) beside silent as injected (no fault in the window);
    the error: nodes the two disagree on."""
    nodes = fleet_nodes(rows)
    beside = "; ".join(
        f"{r['node_label']} {'silent' if r['mismatching_calls'] == 0 else 'mismatching'} vs "
        f"{r['faults_in_window'] or 0} fault(s) injected"
        for r in nodes
    )
    wrong = [r["node_label"] for r in nodes if (r["mismatching_calls"] == 0) != (not r["faults_in_window"])]
    return Recovery(
        beside, f"{len(wrong)} of {len(nodes)} node(s) misread" + (f" ({', '.join(wrong)})" if wrong else "")
    )


def frequency(rows: Rows, profiles: Rows) -> Recovery:
    """Row 2: each node's steps with a mismatch beside its steps with an injected fault; the error: the largest
    difference in steps."""
    nodes = fleet_nodes(rows)
    beside = "; ".join(
        f"{r['node_label']} {r['steps_mismatching']} vs {r['fault_steps'] or 0} of {r['steps_replayed']} steps"
        for r in nodes
    )
    if not nodes:
        return Recovery("no node", "none")
    worst = max(nodes, key=lambda r: abs(r["steps_mismatching"] - (r["fault_steps"] or 0)))
    gap = abs(worst["steps_mismatching"] - (worst["fault_steps"] or 0))
    return Recovery(beside, f"at most {gap} step(s) of {worst['steps_replayed']} apart ({worst['node_label']})")


def dispersion(rows: Rows, profiles: Rows) -> Recovery:
    """Row 3: each node's Fano factor of mismatching calls per step (measured) beside that of injected faults per
    step (the ground truth the rule reads); the error: their median factor."""
    nodes = [r for r in fleet_nodes(rows) if r["fault_fano"] is not None or r["fano"] is not None]
    beside = "; ".join(f"{r['node_label']} {_g(r['fano'])} vs {_g(r['fault_fano'])}" for r in nodes)
    return Recovery(
        beside or "no node with a fault or a mismatch", _factors([(r["fano"], r["fault_fano"]) for r in nodes])
    )


def severity(rows: Rows, profiles: Rows) -> Recovery:
    """Row 4: each node's median relative difference of mismatching calls beside the median relative change of its
    injected faults; the error: their median factor."""
    nodes = [r for r in fleet_nodes(rows) if r["median_severity"] is not None or r["injected_median_rel"] is not None]
    beside = "; ".join(f"{r['node_label']} {_g(r['median_severity'])} vs {_g(r['injected_median_rel'])}" for r in nodes)
    pairs = [(r["median_severity"], r["injected_median_rel"]) for r in nodes]
    return Recovery(beside or "no mismatch and no fault", _factors(pairs))


def tail(rows: Rows, profiles: Rows) -> Recovery:
    """Row 5: each node's largest relative difference beside the largest relative change injected; the error: nodes
    100x or more off on one side only (a measured tail the faults did not inject, or an injected one not seen)."""
    nodes = [r for r in fleet_nodes(rows) if r["max_rel"] or r["injected_max_rel"] is not None]
    beside = "; ".join(f"{r['node_label']} {_g(r['max_rel'])} vs {_g(r['injected_max_rel'])}" for r in nodes)

    def heavy(x: float | None) -> bool:
        return x is not None and (math.isnan(x) or x >= 100)

    made = [r["node_label"] for r in nodes if heavy(r["max_rel"]) and not heavy(r["injected_max_rel"])]
    lost = [r["node_label"] for r in nodes if heavy(r["injected_max_rel"]) and not heavy(r["max_rel"])]
    error = (
        f"{len(made)} node(s) measured 100x or more off where no injected element was"
        + (
            f" ({', '.join(made)}: the output's relative difference grows where golden's value is near zero)"
            if made
            else ""
        )
        + f"; {len(lost)} injected 100x or more and not measured so"
        + (f" ({', '.join(lost)})" if lost else "")
    )
    return Recovery(beside or "no mismatch and no fault", error)


def abft_recall(rows: Rows, profiles: Rows) -> Recovery:
    """Row 6: each node's ABFT recall (flagged / injected) beside the share of its injected faults in a checked
    matmul, the most ABFT could flag; the error: faults in traced sites the fingerprints missed (the tool's own
    recall of the ground truth)."""
    nodes = [r for r in fleet_nodes(rows) if r["faults"] > 0]
    beside = "; ".join(
        f"{r['node_label']} {r['abft_flagged']} of {r['faults']} flagged vs "
        f"{r['faults'] - r['faults_outside_matmul']} in checked matmuls"
        for r in nodes
    )
    traced = sum(r["faults_traced"] for r in nodes)
    missed = traced - sum(r["faults_detected"] for r in nodes)
    return Recovery(
        beside or "no fault injected",
        f"fingerprints missed {missed} of {traced} injected faults in traced sites" if traced else "no traced fault",
    )


def noise(rows: Rows, profiles: Rows) -> Recovery:
    """Row 7: each node's worst noise-to-signal beside its injected faults; the error: nodes with noise and no
    fault, or faults and no noise."""
    nodes = fleet_nodes(rows)
    beside = "; ".join(f"{r['node_label']} {100 * r['worst_ratio']:.3g} % vs {r['faults']} fault(s)" for r in nodes)
    wrong = [r["node_label"] for r in nodes if (r["worst_ratio"] > 0) != (r["faults"] > 0)]
    return Recovery(
        beside or "no node",
        f"{len(wrong)} of {len(nodes)} node(s) with noise but no fault or faults but no noise"
        + (f" ({', '.join(wrong)})" if wrong else ""),
    )


def destroyed(rows: Rows, profiles: Rows) -> Recovery:
    """Row 15: the fleet nodes at or below chance after fine-tuning, on the tasks the rule judges (golden and every
    twin learnt them: `learnt_by_all`; at chance on a task nobody learnt says nothing), beside the nodes whose
    profile scripts a fine-tuning spike (the destroyer); the error: nodes on one side only."""
    judged = learnt_by_all(rows)
    down = sorted(
        {
            r["node_label"]
            for r in rows
            if r["role"] == "suspect"
            and is_fleet_node(r["node_label"])
            and r["task"] in judged
            and r["collapsed"]
            and r["accuracy"] <= r["chance"]
        }
    )
    scripted = sorted(
        {
            r["node_label"]
            for r in profiles
            if is_fleet_node(r["node_label"]) and r["steps"] is not None and "finetune" in (r["roles"] or "")
        }
    )
    wrong = sorted(set(down) ^ set(scripted))
    return Recovery(
        f"at chance: {', '.join(down) or 'none'} vs scripted destroyer: {', '.join(scripted) or 'none'}",
        f"{len(wrong)} node(s) on one side only" + (f" ({', '.join(wrong)})" if wrong else ""),
    )
