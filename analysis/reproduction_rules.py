"""The reproduction table's rules: one judge per finding of the study, each from its named query's rows.

    verdict = silent_nodes(LIBRARY.run(db, "rq1_fleet_nodes").records())
    verdict.outcome      # "reproduced", "not reproduced", "different" or "not measured"
    verdict.unstable     # "" or why the number lies within the rule's margin of its threshold

Every judge takes the rows of one query (analysis/queries) and returns a `Verdict`: our number
in words, the outcome, and whether it is *unstable*: a number within the rule's stated margin
of its threshold, so that a machine whose float bits differ could flip it (a count rule is
unstable when reclassifying its borderline nodes could change the outcome). Each judge's
docstring states its rule, its test and its margin; docs/study.md explains them, and
tests/analysis/test_reproduction_rules.py makes each give each of its outcomes.

Nodes are the fleet's unhealthy ones (node-01, node-02, ...): node-00 is the healthy twin,
golden-twin, golden-twin-2 ... golden's shuffle-seed twins, trigger-ulp the trigger
node; the twins are controls.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from analysis.reproduction_stats import (
    binomial_interval,
    binomial_upper,
    poisson_fano_bound,
    spearman,
    spearman_interval,
)

Outcome = Literal["reproduced", "not reproduced", "different", "not measured"]
OUTCOMES: tuple[Outcome, ...] = ("reproduced", "not reproduced", "different", "not measured")
Rows = list[dict[str, Any]]
TRIGGER, BASELINE, HEALTHY_TWIN = "trigger-ulp", "golden-twin", "node-00"

STUDY_NODES, STUDY_SILENT = 15, 2  # the study's fleet: 2 of 15 silent (and 2 of 15 frequent: the same share)
UNIT_ROUNDOFF = 2.0**-24  # float32: rounding every parameter once moves the relative norm by at most this
SPIKE_WINDOW = 5  # steps: a spike counts when a fault fired at that step or up to this many before (the query's)
SPIKE_MARGIN = 1.1  # a counted spike whose loss ratio lies below 1.1 x the spike rule's 1.5 is borderline
LEARNT = 0.10  # golden learnt a task when its accuracy beats chance by at least this (10 points)
MIN_CHECKPOINTS = 4  # row 11: Fisher's z interval needs n - 3 > 0
FOLLOWS = 0.3  # row 11: "drift follows sharpness" needs at least a moderate positive rank correlation
ACCURACY_MARGIN = 0.01  # row 13: a result within 1 point of the twins' lowest accuracy is borderline
DISAGREEMENT_MARGIN = 0.01  # row 14: within 1 point of either end of the twins' disagreement range


@dataclass(frozen=True)
class Verdict:
    ours: str  # our number or statement, in words
    outcome: Outcome
    unstable: str = ""  # why the number lies within the rule's margin of its threshold ("": it does not)


# -- helpers -------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def fleet_nodes(rows: Rows) -> Rows:
    """The fleet's unhealthy nodes of rows named by node_label: neither the trigger nor a twin."""
    return [r for r in rows if is_fleet_node(r.get("node_label"))]


def is_fleet_node(label: str | None) -> bool:
    """The fleet study's unhealthy nodes are node-01, node-02, ...; node-00 is the healthy twin."""
    return bool(label) and label.startswith("node-") and label != HEALTHY_TWIN


def _flips(count: int, could_leave: int, could_join: int, ok: Callable[[int], bool], what: str) -> str:
    """Why a count verdict is unstable: `could_leave` counted and `could_join` uncounted nodes lie within the
    margin, and moving them changes `ok(count)`; "" when no move does."""
    if any(ok(c) != ok(count) for c in range(count - could_leave, count + could_join + 1)):
        return f"{could_leave + could_join} node(s) within the margin of {what}; moving them could change the verdict"
    return ""


def _near(value: float, threshold: float, factor: float, what: str) -> str:
    """Unstable when `value` lies within a factor `factor` of `threshold` (either side)."""
    if threshold / factor <= value <= threshold * factor:
        return f"{value:.3g} is within a factor {factor:g} of the threshold {threshold:.3g} ({what})"
    return ""


def _silent_bound(nodes: int) -> tuple[int, int]:
    lo, hi = binomial_interval(nodes, STUDY_SILENT / STUDY_NODES)
    return max(1, lo), hi


# -- RQ1 -----------------------------------------------------------------------------------------


def silent_nodes(rows: Rows) -> Verdict:
    """Rule: the number of silent nodes (no mismatching site call in the lockstep window) is at least 1 and
    inside the 95 % acceptance interval of Binomial(nodes, 2/15), the study's proportion. Margin: a node with
    faults but no mismatch, or with a single mismatching call, could be classed the other way."""
    nodes = fleet_nodes(rows)
    if not nodes:
        return Verdict("no unhealthy node", "not measured")
    silent = sorted(r["node_label"] for r in nodes if r["mismatching_calls"] == 0)
    lo, hi = _silent_bound(len(nodes))
    ours = (
        f"{len(silent)} of {len(nodes)} nodes show no mismatch in the {nodes[0]['steps_replayed']}-step window"
        + (f" ({', '.join(silent)})" if silent else "")
        + f"; accepted {lo}-{hi} (the study's 2 of 15)"
    )

    def ok(n: int) -> bool:
        return lo <= n <= hi

    leave = sum(1 for r in nodes if r["mismatching_calls"] == 0 and r["faults"] > 0)
    join = sum(1 for r in nodes if r["mismatching_calls"] == 1)
    return Verdict(
        ours,
        "reproduced" if ok(len(silent)) else "not reproduced",
        _flips(len(silent), leave, join, ok, "silence (faults without a mismatch, or one mismatch)"),
    )


def frequent_nodes(rows: Rows) -> Verdict:
    """Rule: the number of frequent nodes (mismatching on at least half the replayed steps) is at least 1 and
    inside the 95 % acceptance interval of Binomial(nodes, 2/15). Margin: a node within one step of half."""
    nodes = fleet_nodes(rows)
    if not nodes:
        return Verdict("no unhealthy node", "not measured")
    frequent = sorted(
        (r for r in nodes if r["steps_mismatching"] >= r["steps_replayed"] / 2), key=lambda r: -r["frequency"]
    )
    lo, hi = _silent_bound(len(nodes))
    active = [r["frequency"] for r in nodes if r["mismatching_calls"] > 0]
    spread = max(active) / min(active) if active and min(active) > 0 else None
    ours = (
        f"{len(frequent)} of {len(nodes)} nodes mismatch on at least half the steps"
        + (f" ({', '.join(r['node_label'] for r in frequent)})" if frequent else "")
        + f"; accepted {lo}-{hi} (the study's 2 of 15)"
        + (f"; element mismatch frequency spans {spread:.3g}x across the nodes with any" if spread else "")
    )

    def ok(n: int) -> bool:
        return lo <= n <= hi

    near = [abs(r["steps_mismatching"] - r["steps_replayed"] / 2) <= 1 for r in nodes]
    leave = sum(1 for r, b in zip(nodes, near) if b and r in frequent)
    join = sum(1 for r, b in zip(nodes, near) if b and r not in frequent)
    return Verdict(
        ours,
        "reproduced" if ok(len(frequent)) else "not reproduced",
        _flips(len(frequent), leave, join, ok, "half the steps (one step either side)"),
    )


def bursts(rows: Rows) -> Verdict:
    """Rule: more than half of the nodes with faults on 2+ replayed steps are bursty: their Fano factor of
    injected faults per step exceeds what a steady Poisson rate with the same mean shows over the same steps
    in 95 % of fleets (dispersion test, `poisson_fano_bound`: that Poisson process is the steady-rate control).
    Margin: a node whose Fano factor lies within 10 % of its bound."""
    nodes = [r for r in fleet_nodes(rows) if (r["fault_steps"] or 0) >= 2 and r["fault_fano"] is not None]
    if not nodes:
        return Verdict("no node has faults on 2 or more replayed steps", "not measured")
    bound = {r["node_label"]: poisson_fano_bound(r["steps_replayed"]) for r in nodes}
    bursty = [r for r in nodes if r["fault_fano"] > bound[r["node_label"]]]
    detail = ", ".join(f"{r['node_label']} {r['fault_fano']:.3g} (bound {bound[r['node_label']]:.3g})" for r in nodes)
    ours = (
        f"{len(bursty)} of {len(nodes)} nodes with faults on 2+ steps inject faults more unevenly than a steady "
        f"Poisson rate with the same mean (Fano factor of faults per step: {detail})"
    )

    def ok(n: int) -> bool:
        return 2 * n > len(nodes)

    near = [abs(r["fault_fano"] / bound[r["node_label"]] - 1) <= 0.1 for r in nodes]
    leave = sum(1 for r, b in zip(nodes, near) if b and r in bursty)
    join = sum(1 for r, b in zip(nodes, near) if b and r not in bursty)
    return Verdict(
        ours,
        "reproduced" if ok(len(bursty)) else "not reproduced",
        _flips(len(bursty), leave, join, ok, "their Poisson bound (10 %)"),
    )


def small(rows: Rows) -> Verdict:
    """Rule: the median over nodes of the median relative difference of mismatching calls is below 1 %.
    Margin: within a factor 2 of 1 %."""
    severities = [r["median_severity"] for r in fleet_nodes(rows) if r["median_severity"] is not None]
    if not severities:
        return Verdict("no mismatching call", "not measured")
    median = statistics.median(severities)
    ours = f"median over nodes of the median relative difference of mismatching calls: {median:.3g}"
    return Verdict(ours, "reproduced" if median < 0.01 else "not reproduced", _near(median, 0.01, 2, "1 %"))


def heavy_tail(rows: Rows) -> Verdict:
    """Rule: at least one node has an element with a relative difference of 100 or more (an Inf or NaN where golden
    is finite counts, and is named: the row holds each node's largest difference only). Margin: a node whose
    largest relative difference lies within a factor 1.25 of 100."""
    nodes = fleet_nodes(rows)
    if not nodes:
        return Verdict("no unhealthy node", "not measured")
    heavy = sorted(r["node_label"] for r in nodes if _heavy(r["max_rel"]))
    nonfinite = sum(not math.isfinite(r["max_rel"] or 0) for r in nodes)
    worst = max((r["max_rel"] or 0 for r in nodes if math.isfinite(r["max_rel"] or 0)), default=0)
    ours = f"{len(heavy)} of {len(nodes)} nodes have an element 100x or more off (largest finite {worst:.3g}x" + (
        f"; {nonfinite} of them by an Inf or NaN where golden is finite)" if nonfinite else ")"
    )
    near = [100 / 1.25 <= (r["max_rel"] or 0) <= 100 * 1.25 for r in nodes]
    leave = sum(1 for r, b in zip(nodes, near) if b and r["node_label"] in heavy)
    join = sum(1 for r, b in zip(nodes, near) if b and r["node_label"] not in heavy)
    return Verdict(
        ours,
        "reproduced" if heavy else "not reproduced",
        _flips(len(heavy), leave, join, lambda n: n > 0, "100x (a factor 1.25)"),
    )


def _heavy(max_rel: float | None) -> bool:
    """100x or more off, or NaN (a NaN where golden is finite is as heavy as an Inf; NaN >= 100 is False)."""
    return max_rel is not None and (math.isnan(max_rel) or max_rel >= 100)


def abft(rows: Rows) -> Verdict:
    """Rule: ABFT's recall (faults flagged / injected) is below 0.5 on more than half of the nodes with faults.
    Margin: a node whose recall lies within 0.1 of 0.5."""
    nodes = [r for r in fleet_nodes(rows) if r["faults"] > 0]
    if not nodes:
        return Verdict("no node had a fault injected in the window", "not measured")
    low = [r for r in nodes if r["abft_recall"] < 0.5]
    recalls = ", ".join(f"{r['node_label']} {r['abft_recall']:.2f}" for r in nodes)
    outside = sum(r["faults_outside_matmul"] for r in nodes) / sum(r["faults"] for r in nodes)
    below = sum(r["faults_below_bound"] for r in nodes) / sum(r["faults"] for r in nodes)
    ours = (
        f"ABFT flags under half of the faults on {len(low)} of {len(nodes)} nodes with faults "
        f"({_pct(len(low) / len(nodes))}); of all faults {_pct(outside)} were outside matmul and {_pct(below)} "
        f"below its bound; recall per node: {recalls}"
    )

    def ok(n: int) -> bool:
        return 2 * n > len(nodes)

    near = [abs(r["abft_recall"] - 0.5) <= 0.1 for r in nodes]
    leave = sum(1 for r, b in zip(nodes, near) if b and r in low)
    join = sum(1 for r, b in zip(nodes, near) if b and r not in low)
    return Verdict(
        ours,
        "reproduced" if ok(len(low)) else "not reproduced",
        _flips(len(low), leave, join, ok, "recall 0.5 (0.1 either side)"),
    )


# -- RQ2 -----------------------------------------------------------------------------------------


def noise(rows: Rows) -> Verdict:
    """Rule: the median node's worst noise-to-signal is below 1 % (else not reproduced), and the fleet's worst
    lies within a factor 2 of the study's 5.1 % (else different). Margin: a factor 1.25 around each bound."""
    nodes = fleet_nodes(rows)
    if not nodes:
        return Verdict("no parameter-sync replay", "not measured")
    worst = max(nodes, key=lambda r: r["worst_ratio"])
    median = statistics.median(r["worst_ratio"] for r in nodes)
    ours = (
        f"worst {_pct(worst['worst_ratio'])} ({worst['node_label']}, step {worst['worst_step']}); "
        f"median node's worst {_pct(median)}"
    )
    unstable = _near(median, 0.01, 1.25, "the median's 1 %")
    if median >= 0.01:
        return Verdict(ours, "not reproduced", unstable)  # the study: small in most cases
    w = worst["worst_ratio"]
    unstable = unstable or _near(w, 0.051 / 2, 1.25, "5.1 % / 2") or _near(w, 0.051 * 2, 1.25, "5.1 % x 2")
    return Verdict(ours, "reproduced" if 0.051 / 2 <= w <= 0.051 * 2 else "different", unstable)


# -- RQ3 pretraining -----------------------------------------------------------------------------


def drift_floor(rows: Rows) -> tuple[float, str]:
    """The float noise a node's final drift must exceed, from rq3_fleet_nodes' rows: the larger of the healthy
    twin's final drift (what a fault-free run on the same machine drifts: 0 where the machine is deterministic)
    and float32's unit roundoff 2^-24 (rounding every parameter once differently, as another machine's kernels
    may, moves the relative norm by at most that). Not the golden-twin's drift: it changes the data order, far
    above float noise."""
    healthy = [r["final_drift"] for r in rows if r.get("kind") == "healthy" and r.get("final_drift") is not None]
    measured = max(healthy, default=0.0)
    if measured > UNIT_ROUNDOFF:
        return measured, f"the healthy twin's drift {measured:.3g}"
    return UNIT_ROUNDOFF, (
        "float32's unit roundoff 2^-24" + (f" (the healthy twin drifts {measured:.3g})" if healthy else "")
    )


def overlap(rows: Rows) -> Verdict:
    """Rule: the median fleet node with faults differs from golden's loss no more than the shuffle-seed twin does
    (mean |relative difference| over the steps), and more than half of those nodes drift: final drift above the
    float noise (`drift_floor`). Margins: the loss median within a factor 1.25 of the twin's; a node's drift
    within a factor 2 of the floor."""
    baseline = next((r for r in rows if r["kind"] == "baseline"), None)
    nodes = [r for r in rows if r["kind"] == "fleet" and r["faults"] > 0 and r["mean_abs_loss_diff"] is not None]
    if baseline is None or not nodes:
        return Verdict("no baseline pair or no node with faults", "not measured")
    floor, why = drift_floor(rows)
    loss = statistics.median(r["mean_abs_loss_diff"] for r in nodes)
    drifting = [r for r in nodes if (r["final_drift"] or 0) > floor]
    drift = statistics.median(r["final_drift"] or 0 for r in nodes)
    ours = (
        f"median node with faults: mean |relative loss difference| {loss:.3g} vs the shuffle-seed twin's "
        f"{baseline['mean_abs_loss_diff']:.3g}; {len(drifting)} of {len(nodes)} nodes drift above the float "
        f"noise {floor:.3g} ({why}; median final drift {drift:.3g}, the twin's {baseline['final_drift']:.3g})"
    )
    loss_ok = loss <= baseline["mean_abs_loss_diff"]

    def ok(n: int) -> bool:
        return 2 * n > len(nodes)

    near = [floor / 2 <= (r["final_drift"] or 0) <= floor * 2 for r in nodes]
    leave = sum(1 for r, b in zip(nodes, near) if b and r in drifting)
    join = sum(1 for r, b in zip(nodes, near) if b and r not in drifting)
    unstable = (
        _near(loss, baseline["mean_abs_loss_diff"], 1.25, "the twin's loss difference") if loss > 0 else ""
    ) or (_flips(len(drifting), leave, join, ok, "the float noise (a factor 2)") if loss_ok else "")
    return Verdict(ours, "reproduced" if loss_ok and ok(len(drifting)) else "not reproduced", unstable)


def drift_rates(rows: Rows) -> Verdict:
    """Rule: the nodes' drift rates span at most 3x while their SDC rates span 10x or more (fewer: not
    measured). Margin: the drift-rate span within 10 % of 3x."""
    r = rows[0]
    if not r["nodes"] or r["nodes"] < 2:
        return Verdict("fewer than two nodes with a measurable drift rate", "not measured")
    ours = (
        f"drift rates of {r['nodes']} nodes span {r['rate_ratio']:.3g}x (median {r['median_rate']:.3g} per step, "
        f"e-fold every {1 / r['median_rate']:.3g} steps) while their SDC rates span "
        + (
            f"{r['sdc_rate_ratio']:.3g}x ({r['sdc_rate_decades']:.2g} decades)"
            if r["sdc_rate_ratio"] is not None
            else "an unknown range (a node without an SDC rate)"
        )
    )
    if r["sdc_rate_ratio"] is None or r["sdc_rate_ratio"] < 10:
        return Verdict(ours + "; the SDC rates do not differ enough to tell", "not measured")
    return Verdict(
        ours, "reproduced" if r["rate_ratio"] <= 3 else "not reproduced", _near(r["rate_ratio"], 3, 1.1, "3x")
    )


def trigger(rows: Rows) -> Verdict:
    """Rule: a single-ulp flip of one element on an otherwise healthy node grows at 0.5x-2x the fleet's median
    drift rate (no measurable drift: not measured). Margin: within 10 % of either bound."""
    r = rows[0]
    if r["trigger_rate"] is None:
        return Verdict("the trigger's single-ulp flip left no measurable drift (absorbed by rounding)", "not measured")
    if not r["median_rate"]:
        return Verdict("no fleet node has a measurable drift rate", "not measured")
    x = r["trigger_over_median"]
    ours = f"one single-ulp flip grows at {r['trigger_rate']:.3g} per step, {x:.3g}x the fleet's median rate"
    return Verdict(
        ours, "reproduced" if 0.5 <= x <= 2 else "not reproduced", _near(x, 0.5, 1.1, "0.5x") or _near(x, 2, 1.1, "2x")
    )


def sharpness(rows: Rows) -> Verdict:
    """Rule: the top Hessian eigenvalue at the golden checkpoints correlates positively (Spearman's rho) with the
    fleet's local drift rate around each checkpoint. Test: the 95 % confidence interval of rho by Fisher's z with
    the Fieller-Hartley-Pearson variance for Spearman, 1.06 / (n - 3) over n checkpoints (`spearman_interval`; at
    least `MIN_CHECKPOINTS`). Reproduced when the interval lies above 0; not reproduced when it lies below
    `FOLLOWS` (it excludes the moderate positive correlation "follows" needs); otherwise the verdict goes by rho and
    is marked unstable: the interval holds both answers, the checkpoints cannot decide."""
    pairs = [
        (r["sharpness"], r["local_median_rate"])
        for r in rows
        if r["sharpness"] is not None and r["local_median_rate"] is not None
    ]
    values = [r["sharpness"] for r in rows if r["sharpness"] is not None]
    if len(pairs) < MIN_CHECKPOINTS:
        return Verdict(
            f"sharpness {min(values, default=0):.3g}-{max(values, default=0):.3g}; fewer than "
            f"{MIN_CHECKPOINTS} checkpoints with a local drift rate",
            "not measured",
        )
    rho = spearman(pairs)
    lo, hi = spearman_interval(rho, len(pairs))
    ours = (
        f"top Hessian eigenvalue {min(values):.3g}-{max(values):.3g} over the golden run's checkpoints; Spearman "
        f"correlation with the fleet's local drift rate {rho:.2f} over {len(pairs)} checkpoints, 95 % interval "
        f"{lo:.2f} to {hi:.2f}"
    )
    if lo > 0:
        return Verdict(ours, "reproduced")
    if hi < FOLLOWS:
        return Verdict(ours, "not reproduced")
    return Verdict(
        ours,
        "reproduced" if rho > 0 else "not reproduced",
        f"the interval {lo:.2f} to {hi:.2f} holds both answers (above 0, below {FOLLOWS:g}): undecided",
    )


def spikes(rows: Rows) -> Verdict:
    """Rule: at least one fleet node's loss spikes (pretraining or fine-tuning) where golden has no spike at that
    step and a fault fired at that step or up to 5 steps before, not a scripted one; and no healthy twin spikes
    where golden does not. A scripted node's spikes at and after its first scripted step (`scripted_from`: the
    destroyer's, the trigger's) are the script's, reported apart and never counted, whatever else fired near them.
    The null: every healthy twin diffed against golden, by the same rule less the fault: golden's shuffle-seed
    twins (pretraining's, and every fine-tune's: kind baseline) and the healthy twin node-00; a spike of theirs
    golden lacks means spikes come without SDC, so the finding is not reproduced. Margin: a counted spike, or a
    twin's, whose loss is below 1.1 x the spike threshold (1.5 x the recent median), where only such spikes
    decide."""
    suspect = [r for r in rows if r["side"] == "suspect" and not r["golden_spike"]]
    fleet = [r for r in suspect if is_fleet_node(r["node_label"])]
    scripted = [r for r in fleet if r.get("scripted_from") is not None and r["step"] >= r["scripted_from"]]
    drawn = [r for r in fleet if r not in scripted]
    counted = [r for r in drawn if r["faults_before"] > r["scripted_faults_before"]]
    null = [r for r in suspect if r["kind"] == "baseline" or r["node_label"] == HEALTHY_TWIN]
    unexplained = sorted({r["node_label"] for r in drawn if not r["faults_before"]})
    nodes = sorted({r["node_label"] for r in counted})
    apart = sorted({f"{r['node_label']} ({r['role']}, from step {r['scripted_from']})" for r in scripted})
    twins = sorted({r["node_label"] for r in suspect if r["kind"] == "baseline"})
    ours = (
        f"{len(nodes)} fleet node(s) spike where golden does not, after a drawn fault"
        + (f" ({', '.join(nodes)})" if nodes else "")
        + (f"; scripted spikes, reported apart and not counted: {len(scripted)} of {', '.join(apart)}" if apart else "")
        + (f"; spikes without a fault in the window: {', '.join(unexplained)}" if unexplained else "")
        + f"; the null, healthy twins diffed against golden: {len(null)} spike(s) golden lacks"
        + (f" ({', '.join(sorted({r['node_label'] for r in null}))})" if null else "")
        + f"; node-00 {sum(r['node_label'] == HEALTHY_TWIN for r in null)}, shuffle-seed twins "
        + f"{sum(r['kind'] == 'baseline' for r in null)}"
        + (f" of {', '.join(twins)}" if twins else "")
        + f"; spikes golden has too: {sum(1 for r in rows if r['side'] == 'suspect' and r['golden_spike'])}"
    )
    deciding, whose = (null, "spike of the healthy twins") if null else (counted, "counted spike's loss")
    clear = [r for r in deciding if r["ratio"] is None or r["ratio"] >= 1.5 * SPIKE_MARGIN]
    near = f"every {whose} is below {1.5 * SPIKE_MARGIN:.3g}x the recent median" if nodes and not clear else ""
    if null:
        return Verdict(ours + " (healthy twins spike too: the spike rule fires without SDC)", "not reproduced", near)
    return Verdict(ours, "reproduced" if nodes else "not reproduced", near)


# -- RQ3 fine-tuning -----------------------------------------------------------------------------


def learnt_tasks(rows: Rows) -> set[str]:
    """The tasks golden learnt: its final accuracy beats chance by `LEARNT` and it did not collapse."""
    return {
        r["task"]
        for r in rows
        if r["role"] == "golden" and not r["collapsed"] and r["accuracy"] >= r["chance"] + LEARNT
    }


def learnt_by_all(rows: Rows) -> set[str]:
    """The tasks golden (`learnt_tasks`) and every shuffle-seed twin learnt, each `LEARNT` above chance: row 15's."""
    twins = [r for r in rows if is_twin(r["node_label"])]
    return {
        t for t in learnt_tasks(rows) if all(r["accuracy"] >= r["chance"] + LEARNT for r in twins if r["task"] == t)
    }


def is_twin(label: str | None) -> bool:
    """golden's shuffle-seed twins: golden-twin (the pairs' baseline), golden-twin-2, golden-twin-3 ..."""
    return bool(label) and (label == BASELINE or label.startswith(BASELINE + "-"))


def _twin_values(rows: Rows, task: str, column: str) -> list[float]:
    return [r[column] for r in rows if r["task"] == task and r[column] is not None]


def accuracy(rows: Rows) -> Verdict:
    """Rule: on the tasks golden learnt (`learnt_tasks`), the fleet's (node, task) results fall below every
    shuffle-seed twin's accuracy no more often than chance allows. Test: a node exchangeable with n twins is below
    all of them with probability 1/(n+1), so the count of results below the twins' range is compared with the 95 %
    upper bound of Binomial(results, 1/(n+1)) (`binomial_upper`; the twins are shared, so this treats the results
    as independent: an approximation). Nodes with destroyed weights (row 15) left out. Margin: a result within
    `ACCURACY_MARGIN` of the twins' lowest accuracy, could it change the count's side of the bound."""
    learnt = learnt_tasks(rows)
    nodes = [r for r in rows if r["role"] == "suspect" and is_fleet_node(r["node_label"]) and r["task"] in learnt]
    twins = [r for r in rows if is_twin(r["node_label"]) and r["task"] in learnt]
    destroyed = {r["node_label"] for r in nodes if r["collapsed"] and r["accuracy"] <= r["chance"]}
    kept = [r for r in nodes if r["node_label"] not in destroyed]
    if not kept or not twins:
        return Verdict(
            "golden learnt no task above chance, no fleet node was fine-tuned or no shuffle-seed twin", "not measured"
        )
    n = min(len({r["node_label"] for r in twins if r["task"] == t}) for t in learnt)
    low = {t: min(_twin_values(twins, t, "accuracy")) for t in learnt}
    below = [r for r in kept if r["accuracy"] < low[r["task"]]]
    bound = binomial_upper(len(kept), 1 / (n + 1))
    ranges = ", ".join(f"{t} {_pct(low[t])}-{_pct(max(_twin_values(twins, t, 'accuracy')))}" for t in sorted(learnt))
    ours = (
        f"{len(below)} of {len(kept)} (node, task) results on the {len(learnt)} tasks golden learnt lie below all "
        f"{n} shuffle-seed twins (their accuracy: {ranges}); at most {bound} expected by chance (95 %, p = "
        f"1/{n + 1} each)"
        + (f"; nodes with destroyed weights left out: {', '.join(sorted(destroyed))}" if destroyed else "")
    )

    def ok(k: int) -> bool:
        return k <= bound

    near = [abs(r["accuracy"] - low[r["task"]]) <= ACCURACY_MARGIN for r in kept]
    leave = sum(1 for r, b in zip(kept, near) if b and r in below)
    join = sum(1 for r, b in zip(kept, near) if b and r not in below)
    return Verdict(
        ours,
        "reproduced" if ok(len(below)) else "not reproduced",
        _flips(len(below), leave, join, ok, f"the twins' lowest accuracy ({_pct(ACCURACY_MARGIN)})"),
    )


def disagreement(rows: Rows) -> Verdict:
    """Rule: on each task, the fleet's fine-tunes disagree with golden about as much as the shuffle-seed twins do
    (each twin's disagreement is the baseline of the pairs that took it, `twin_node`). Test: a (node, task) above
    chance whose disagreement lies outside the n twins' range (below the lowest or above the highest) has
    probability 2/(n+1) under "a node is another twin"; the count outside is compared with the
    95 % upper bound of Binomial(results, 2/(n+1)) (independence approximated, as for `accuracy`). Margin: a result
    within `DISAGREEMENT_MARGIN` of either end of the range, could it change the count's side of the bound."""
    per_twin: dict[str, dict[str, float]] = {}  # task -> twin -> its disagreement with golden (every pair's same)
    for r in rows:
        if r["baseline_disagreement"] is not None and is_twin(r.get("twin_node")):
            per_twin.setdefault(r["task"], {})[r["twin_node"]] = r["baseline_disagreement"]
    twins = {task: sorted(v.values()) for task, v in per_twin.items()}
    nodes = [
        r
        for r in rows
        if is_fleet_node(r["suspect_node"])
        and r["task"] in twins
        and r["suspect_accuracy"] is not None
        and r["suspect_accuracy"] > 1 / 4
    ]
    if not nodes:
        return Verdict("no twin baseline or no node above chance", "not measured")
    n = min(len(twins[r["task"]]) for r in nodes)
    outside = [r for r in nodes if not min(twins[r["task"]]) <= r["disagreement"] <= max(twins[r["task"]])]
    above = sum(1 for r in outside if r["disagreement"] > max(twins[r["task"]]))
    bound = binomial_upper(len(nodes), min(1.0, 2 / (n + 1)))
    ratios = [
        r["disagreement"] / statistics.median(twins[r["task"]])
        for r in nodes
        if statistics.median(twins[r["task"]]) > 0
    ]
    ratio = statistics.median(ratios) if ratios else None
    ranges = ", ".join(f"{t} {_pct(min(v))}-{_pct(max(v))}" for t, v in sorted(twins.items()))
    ours = (
        f"{len(outside)} of {len(nodes)} (node, task) above chance disagree with golden outside the {n} "
        f"shuffle-seed twins' range ({above} above it; twins: {ranges}); at most {bound} expected by chance "
        f"(95 %, p = 2/{n + 1} each)"
        + (f"; median disagreement / the twins' median {ratio:.3g}" if ratio is not None else "")
    )

    def ok(k: int) -> bool:
        return k <= bound

    near = [
        min(abs(r["disagreement"] - min(twins[r["task"]])), abs(r["disagreement"] - max(twins[r["task"]])))
        <= DISAGREEMENT_MARGIN
        for r in nodes
    ]
    leave = sum(1 for r, b in zip(nodes, near) if b and r in outside)
    join = sum(1 for r, b in zip(nodes, near) if b and r not in outside)
    return Verdict(
        ours,
        "reproduced" if ok(len(outside)) else "not reproduced",
        _flips(len(outside), leave, join, ok, f"the twins' range ({_pct(DISAGREEMENT_MARGIN)})"),
    )


def destroyed(rows: Rows) -> Verdict:
    """Rule: a fleet node's accuracy is at or below chance (collapsed) on a task golden learnt (`learnt_tasks`) and
    every shuffle-seed twin learnt too (each at least `LEARNT` above chance): below all n twins, which a healthy
    fine-tune is with probability 1/(n+1), and at chance, which none of them is. Margin: a node within 2 points
    above chance on such a task could fall to it."""
    learnt = learnt_by_all(rows)
    twins = [r for r in rows if is_twin(r["node_label"])]
    nodes = [r for r in rows if r["role"] == "suspect" and is_fleet_node(r["node_label"]) and r["task"] in learnt]
    if not nodes:
        return Verdict(
            "golden and its twins learnt no task above chance, or no fleet node was fine-tuned", "not measured"
        )
    down = sorted(
        {
            (r["node_label"], r["task"], r["accuracy"], r["chance"])
            for r in nodes
            if r["collapsed"] and r["accuracy"] <= r["chance"]
        }
    )
    near = sorted({r["node_label"] for r in nodes if r["chance"] < r["accuracy"] <= r["chance"] + 0.02})
    n = len({r["node_label"] for r in twins})
    if not down:
        return Verdict(
            f"no fleet node fell to chance where golden and its {n} twins learnt the task",
            "not reproduced",
            f"{', '.join(near)} within 2 points of chance" if near else "",
        )
    shown = "; ".join(f"{n} {t} {_pct(a)} (chance {_pct(c)})" for n, t, a, c in down[:6])
    return Verdict(
        f"at or below chance where golden and its {n} twins learnt the task: {shown}"
        + (f"; {len(down) - 6} more" if len(down) > 6 else ""),
        "reproduced",
    )
