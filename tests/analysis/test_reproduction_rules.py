"""Every rule of the reproduction table gives each of its outcomes on small hand-built rows; its statistics are right.

The rows have the columns of the judge's named query (analysis/queries); the statistics are
checked against exact values computed here (binomial sums, tabulated chi-square quantiles).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from analysis import reproduction
from analysis import reproduction_provenance as prov
from analysis import reproduction_rules as rules
from analysis import reproduction_stats as stats
from analysis.reproduction import FINDINGS, Reproduction, build_reproduction, to_markdown

Row = dict[str, Any]


# -- statistics ----------------------------------------------------------------------------------


def test_binomial_interval_leaves_at_most_two_and_a_half_percent_in_each_tail() -> None:
    for n in (5, 15, 30):
        p = 2 / 15
        lo, hi = stats.binomial_interval(n, p)
        pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
        assert sum(pmf[:lo]) <= 0.025 < sum(pmf[: lo + 1])
        assert sum(pmf[hi + 1 :]) <= 0.025 < sum(pmf[hi:])
    assert stats.binomial_interval(5, 2 / 15) == (0, 2)
    assert stats.binomial_interval(15, 2 / 15) == (0, 5)


@pytest.mark.parametrize(("k", "table"), [(3, 7.815), (10, 18.307), (23, 35.172), (39, 54.572)])
def test_chi2_quantile_is_within_one_percent_of_the_table(k: int, table: float) -> None:
    assert stats.chi2_quantile(k) == pytest.approx(table, rel=0.01)


def test_poisson_fano_bound_is_the_dispersion_tests_quantile_over_the_steps() -> None:
    assert stats.poisson_fano_bound(24) == pytest.approx(35.172 / 24, rel=0.01)
    assert stats.poisson_fano_bound(24) > 1


def test_spearman() -> None:
    assert stats.spearman([(1, 2), (2, 3), (3, 5)]) == pytest.approx(1)
    assert stats.spearman([(1, 5), (2, 3), (3, 2)]) == pytest.approx(-1)
    assert stats.spearman([(1, 1), (2, 1), (3, 1)]) == 0.0


# -- RQ1 -----------------------------------------------------------------------------------------


def rq1(
    label: str,
    *,
    calls: int = 0,
    steps: int = 0,
    faults: int = 0,
    fault_steps: int = 0,
    fault_fano: float | None = None,
    severity: float | None = None,
    max_rel: float = 0.0,
    recall: float | None = None,
    outside: int = 0,
    below: int = 0,
    replayed: int = 24,
) -> Row:
    """One rq1_fleet_nodes row."""
    return {
        "node_label": label,
        "steps_replayed": replayed,
        "steps_mismatching": steps,
        "mismatching_calls": calls,
        "frequency": 1e-6 * (calls + 1),
        "median_severity": severity,
        "max_rel": max_rel,
        "fano": None,
        "faults": faults,
        "faults_in_window": faults,
        "fault_steps": fault_steps,
        "fault_fano": fault_fano,
        "faults_outside_matmul": outside,
        "faults_below_bound": below,
        "abft_recall": recall,
    }


def fleet(*rows: Row) -> list[Row]:
    return list(rows)


def test_silent_nodes() -> None:
    busy = [rq1(f"node-0{i}", calls=5, faults=5) for i in range(3, 6)]
    v = rules.silent_nodes([rq1("node-01"), rq1("node-02"), *busy])
    assert v.outcome == "reproduced" and not v.unstable and "accepted 1-2" in v.ours
    assert rules.silent_nodes([rq1(f"node-0{i}") for i in range(1, 5)] + busy[:1]).outcome == "not reproduced"
    assert rules.silent_nodes(busy).outcome == "not reproduced"  # none silent
    assert rules.silent_nodes([rq1("trigger-ulp"), rq1("golden-twin")]).outcome == "not measured"
    # node-03 had faults and no mismatch: on another machine it could mismatch, leaving 2 silent of 5
    v = rules.silent_nodes([rq1("node-01"), rq1("node-02"), rq1("node-03", faults=2), *busy[1:]])
    assert v.outcome == "not reproduced" and "margin" in v.unstable
    v = rules.silent_nodes([rq1("node-01", faults=3), *busy])
    assert v.outcome == "reproduced" and "margin" in v.unstable


def test_frequent_nodes() -> None:
    quiet = [rq1(f"node-0{i}", calls=1, steps=1) for i in range(2, 6)]
    v = rules.frequent_nodes([rq1("node-01", calls=30, steps=20), *quiet])
    assert v.outcome == "reproduced" and not v.unstable
    assert rules.frequent_nodes(quiet + [rq1("node-06", calls=1, steps=2)]).outcome == "not reproduced"
    every = [rq1(f"node-0{i}", calls=30, steps=20) for i in range(1, 6)]
    assert rules.frequent_nodes(every).outcome == "not reproduced"
    assert rules.frequent_nodes([]).outcome == "not measured"
    v = rules.frequent_nodes([rq1("node-01", calls=30, steps=12), *quiet])  # 12 of 24: one step from half
    assert v.outcome == "reproduced" and v.unstable


def test_bursts_use_injected_faults_against_a_poisson_rate() -> None:
    steady = stats.poisson_fano_bound(24) * 0.5
    bursty = stats.poisson_fano_bound(24) * 3
    rows = [
        rq1("node-01", faults=10, fault_steps=3, fault_fano=bursty),
        rq1("node-02", faults=10, fault_steps=3, fault_fano=bursty),
        rq1("node-03", faults=10, fault_steps=8, fault_fano=steady),
    ]
    v = rules.bursts(rows)
    assert v.outcome == "reproduced" and not v.unstable and "2 of 3" in v.ours
    # one fault mismatching two calls makes the old Fano factor of mismatching calls 2: the rule does not read it
    doubled = [{**rq1(f"node-0{i}", faults=8, fault_steps=8, fault_fano=0.7), "fano": 2.0} for i in range(1, 4)]
    assert rules.bursts(doubled).outcome == "not reproduced"
    assert rules.bursts([rq1("node-01", faults=1, fault_steps=1, fault_fano=0.96)]).outcome == "not measured"
    near = [
        rq1("node-01", faults=10, fault_steps=3, fault_fano=bursty),
        rq1("node-02", faults=10, fault_steps=8, fault_fano=stats.poisson_fano_bound(24) * 0.95),
    ]
    v = rules.bursts(near)
    assert v.outcome == "not reproduced" and "margin" in v.unstable


def test_small() -> None:
    assert rules.small([rq1("node-01", severity=1e-5), rq1("node-02", severity=1e-4)]).outcome == "reproduced"
    assert rules.small([rq1("node-01", severity=0.5)]).outcome == "not reproduced"
    assert rules.small([rq1("node-01")]).outcome == "not measured"
    assert rules.small([rq1("node-01", severity=0.008)]).unstable


def test_heavy_tail() -> None:
    assert rules.heavy_tail([rq1("node-01", max_rel=516), rq1("node-02", max_rel=1)]).outcome == "reproduced"
    assert rules.heavy_tail([rq1("node-01", max_rel=50)]).outcome == "not reproduced"
    assert rules.heavy_tail([]).outcome == "not measured"
    v = rules.heavy_tail([rq1("node-01", max_rel=math.inf), rq1("node-02", max_rel=516)])
    assert v.outcome == "reproduced" and "(largest finite 516x; 1 of them by an Inf or NaN" in v.ours
    v = rules.heavy_tail([rq1("node-01", max_rel=99)])  # a scale by 100 is 99 times off
    assert v.outcome == "not reproduced" and v.unstable


def test_abft() -> None:
    low = [rq1(f"node-0{i}", faults=10, recall=0.1, outside=8, below=1) for i in range(1, 3)]
    high = [rq1(f"node-0{i}", faults=10, recall=0.9) for i in range(3, 6)]
    v = rules.abft(low + high[:1])
    assert v.outcome == "reproduced" and not v.unstable
    assert rules.abft(low[:1] + high).outcome == "not reproduced"
    assert rules.abft([rq1("node-01")]).outcome == "not measured"
    v = rules.abft(low[:1] + [rq1("node-04", faults=10, recall=0.55)])
    assert v.outcome == "not reproduced" and v.unstable


# -- RQ2 -----------------------------------------------------------------------------------------


def rq2(label: str, worst: float) -> Row:
    return {"node_label": label, "worst_ratio": worst, "worst_step": 3}


def test_noise() -> None:
    quiet = [rq2("node-01", 0.0), rq2("node-02", 0.001)]
    assert rules.noise(quiet + [rq2("node-03", 0.05)]).outcome == "reproduced"
    assert rules.noise(quiet + [rq2("node-03", 0.0003)]).outcome == "different"
    assert rules.noise([rq2("node-01", 0.2), rq2("node-02", 0.3)]).outcome == "not reproduced"
    assert rules.noise([rq2("node-00", 0.0)]).outcome == "not measured"
    v = rules.noise(quiet + [rq2("node-03", 0.024)])
    assert v.outcome == "different" and "5.1 % / 2" in v.unstable


# -- RQ3 pretraining -----------------------------------------------------------------------------


def rq3(label: str, kind: str, *, faults: int = 0, loss: float = 0.0, drift: float = 0.0) -> Row:
    """One rq3_fleet_nodes row."""
    return {"node_label": label, "kind": kind, "faults": faults, "mean_abs_loss_diff": loss, "final_drift": drift}


TWIN = rq3("golden-twin", "baseline", loss=0.06, drift=0.16)
HEALTHY = rq3("node-00", "healthy")


def test_overlap_needs_drift_above_the_float_noise() -> None:
    drifting = [rq3(f"node-0{i}", "fleet", faults=5, loss=1e-7, drift=1e-5) for i in range(1, 4)]
    v = rules.overlap([TWIN, HEALTHY, *drifting])
    assert v.outcome == "reproduced" and not v.unstable and "2^-24" in v.ours
    # drift above zero but below float32's unit roundoff is not drift
    tiny = [rq3(f"node-0{i}", "fleet", faults=5, loss=1e-7, drift=1e-9) for i in range(1, 4)]
    assert rules.overlap([TWIN, HEALTHY, *tiny]).outcome == "not reproduced"
    # a healthy twin that drifts (a nondeterministic machine) raises the floor
    noisy = {**HEALTHY, "final_drift": 1e-4}
    v = rules.overlap([TWIN, noisy, *drifting])
    assert v.outcome == "not reproduced" and "healthy twin's drift" in v.ours
    apart = [{**r, "mean_abs_loss_diff": 0.5} for r in drifting]
    assert rules.overlap([TWIN, HEALTHY, *apart]).outcome == "not reproduced"
    assert rules.overlap([HEALTHY, *drifting]).outcome == "not measured"
    near = [rq3(f"node-0{i}", "fleet", faults=5, loss=1e-7, drift=d) for i, d in ((1, 1e-7), (2, 1e-5), (3, 1e-9))]
    v = rules.overlap([TWIN, HEALTHY, *near])
    assert v.outcome == "reproduced" and v.unstable


def spread(**kw: Any) -> Row:
    base = {
        "nodes": 4,
        "rate_ratio": 1.5,
        "median_rate": 0.1,
        "sdc_rate_ratio": 100.0,
        "sdc_rate_decades": 2.0,
        "trigger_rate": 0.1,
        "trigger_over_median": 1.0,
    }
    return base | kw


def test_drift_rates() -> None:
    assert rules.drift_rates([spread()]).outcome == "reproduced"
    assert rules.drift_rates([spread(rate_ratio=10.0)]).outcome == "not reproduced"
    assert rules.drift_rates([spread(sdc_rate_ratio=3.0)]).outcome == "not measured"
    assert rules.drift_rates([spread(nodes=1)]).outcome == "not measured"
    assert rules.drift_rates([spread(rate_ratio=3.1)]).unstable


def test_trigger() -> None:
    assert rules.trigger([spread()]).outcome == "reproduced"
    assert rules.trigger([spread(trigger_over_median=5.0)]).outcome == "not reproduced"
    assert rules.trigger([spread(trigger_rate=None)]).outcome == "not measured"
    assert rules.trigger([spread(median_rate=None)]).outcome == "not measured"
    assert rules.trigger([spread(trigger_over_median=0.48)]).unstable


def test_sharpness_decides_only_when_its_interval_excludes_the_other_answer() -> None:
    def rows(rates: list[float]) -> list[Row]:
        return [{"sharpness": float(i), "local_median_rate": r} for i, r in enumerate(rates, 1)]

    up = rows([0.1 * i for i in range(1, 21)])  # rho 1 over 20 checkpoints: the interval lies above 0
    v = rules.sharpness(up)
    assert v.outcome == "reproduced" and not v.unstable and "95 % interval" in v.ours
    down = rows([-0.1 * i for i in range(1, 21)])  # rho -1: the interval lies below FOLLOWS
    v = rules.sharpness(down)
    assert v.outcome == "not reproduced" and not v.unstable
    assert rules.sharpness(up[:3]).outcome == "not measured"  # fewer than MIN_CHECKPOINTS
    v = rules.sharpness(rows([1, 3, 2, 4]))  # rho 0.8 over 4 checkpoints: the interval still reaches below 0
    assert v.outcome == "reproduced" and "undecided" in v.unstable and "0.80 over 4" in v.ours
    flat = rows([2, 1, 3, 0, 5, 4, -1])
    v = rules.sharpness(flat)
    assert "undecided" in v.unstable


def test_spearman_interval_by_fishers_z() -> None:
    lo, hi = stats.spearman_interval(0.5, 20)
    half = 1.959963984540054 * math.sqrt(1.06 / 17)
    z = math.atanh(0.5)
    assert (lo, hi) == (pytest.approx(math.tanh(z - half)), pytest.approx(math.tanh(z + half)))
    assert stats.spearman_interval(0.0, 30)[0] == pytest.approx(-stats.spearman_interval(0.0, 30)[1])
    with pytest.raises(ValueError):
        stats.spearman_interval(0.5, 3)


def test_binomial_upper_bound_leaves_at_most_five_percent_above_it() -> None:
    for n, p in ((10, 1 / 6), (75, 1 / 6), (75, 1 / 3), (5, 0.5)):
        k = stats.binomial_upper(n, p)
        pmf = [math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(n + 1)]
        assert sum(pmf[k + 1 :]) <= 0.05 < sum(pmf[k:])
    assert stats.binomial_upper(10, 1 / 6) == 4


def spike(
    label: str,
    kind: str,
    *,
    golden: bool = False,
    faults: int = 0,
    scripted: int = 0,
    ratio: float = 3.0,
    side: str = "suspect",
    step: int = 7,
    scripted_from: int | None = None,
    role: str = "train",
) -> Row:
    """One rq3_loss_spikes row; a scripted fault in its window puts its scripted_from at its step at the latest."""
    return {
        "node_label": label,
        "kind": kind,
        "side": side,
        "role": role,
        "golden_spike": golden,
        "faults_before": faults,
        "scripted_faults_before": scripted,
        "scripted_from": scripted_from if scripted_from is not None or not scripted else step,
        "ratio": ratio,
        "step": step,
    }


def test_spikes_count_only_after_a_fault_and_not_where_golden_spikes() -> None:
    v = rules.spikes([spike("node-03", "fleet", faults=2)])
    assert v.outcome == "reproduced" and "node-03" in v.ours and not v.unstable
    assert rules.spikes([]).outcome == "not reproduced"
    # golden's own spike, a spike without a fault, the scripted destroyer: none counts
    v = rules.spikes(
        [
            spike("node-03", "fleet", golden=True, faults=2),
            spike("golden", "golden", golden=True, side="golden"),
            spike("node-04", "fleet"),
            spike("node-07", "fleet", faults=1, scripted=1),
        ]
    )
    assert v.outcome == "not reproduced"
    assert "reported apart and not counted: 1 of node-07 (train, from step 7)" in v.ours
    assert "without a fault in the window: node-04" in v.ours
    # the healthy twins are the null: a spike of theirs golden lacks means spikes come without SDC
    v = rules.spikes([spike("golden-twin", "baseline"), spike("node-03", "fleet", faults=2)])
    assert v.outcome == "not reproduced" and "shuffle-seed twins 1 of golden-twin" in v.ours
    assert rules.spikes([spike("node-00", "healthy"), spike("node-03", "fleet", faults=2)]).outcome == "not reproduced"
    v = rules.spikes([spike("node-03", "fleet", faults=2, ratio=1.6)])
    assert v.outcome == "reproduced" and v.unstable


# -- RQ3 fine-tuning -----------------------------------------------------------------------------


def acc(
    label: str, role: str, task: str, accuracy: float, *, below: bool = False, chance: float = 0.25, golden: float = 0.8
) -> Row:
    """One rq3_finetune_accuracy row."""
    return {
        "node_label": label,
        "role": role,
        "task": task,
        "accuracy": accuracy,
        "chance": chance,
        "collapsed": accuracy <= chance,
        "golden_accuracy": golden,
        "accuracy_vs_golden": accuracy - golden,
        "below_golden": below,
    }


GOLDEN = [acc("golden", "golden", "copy", 0.8), acc("golden", "golden", "match", 0.28, golden=0.28)]
TWINS = [
    acc("golden-twin", "twin", "copy", 0.78),
    acc("golden-twin-2", "suspect", "copy", 0.82),
    acc("golden-twin-3", "suspect", "copy", 0.80),
    acc("golden-twin", "twin", "match", 0.27, golden=0.28),
]


def test_accuracy_counts_results_below_every_twin_against_a_binomial_bound() -> None:
    nodes = [acc(f"node-{i:02d}", "suspect", "copy", 0.8) for i in range(1, 11)]
    v = rules.accuracy(GOLDEN + TWINS + nodes)
    assert v.outcome == "reproduced" and not v.unstable and "0 of 10" in v.ours and "3 shuffle-seed twins" in v.ours
    assert "at most 5 expected" in v.ours  # binomial_upper(10, 1/4)
    below = [acc(f"node-{i:02d}", "suspect", "copy", 0.5, below=True) for i in range(1, 11)]
    assert rules.accuracy(GOLDEN + TWINS + below).outcome == "not reproduced"
    assert rules.accuracy(GOLDEN[1:] + TWINS + nodes).outcome == "not measured"  # golden at 28 % on 25 %: not learnt
    assert rules.accuracy(GOLDEN + nodes).outcome == "not measured"  # no twin: no distribution
    edge = nodes[:4] + below[4:]  # 6 below, bound 5, and one of them within a point of the twins' lowest
    edge[4] = acc("node-05", "suspect", "copy", 0.775)
    v = rules.accuracy(GOLDEN + TWINS + edge)
    assert v.outcome == "not reproduced" and "within the margin" in v.unstable


def test_destroyed_needs_a_task_golden_and_its_twins_learnt() -> None:
    v = rules.destroyed(
        GOLDEN + TWINS + [acc("node-06", "suspect", "copy", 0.0), acc("node-01", "suspect", "copy", 0.8)]
    )
    assert v.outcome == "reproduced" and "node-06 copy" in v.ours and "3 twins" in v.ours
    # at chance on a task golden barely beats chance is no destroyed node
    v = rules.destroyed(
        GOLDEN + TWINS + [acc("node-06", "suspect", "match", 0.2, golden=0.28), acc("node-01", "suspect", "copy", 0.8)]
    )
    assert v.outcome == "not reproduced" and not v.unstable
    # nor on a task a twin did not learn
    weak = [acc("golden-twin-2", "suspect", "copy", 0.3)]
    assert rules.destroyed(GOLDEN + weak + [acc("node-06", "suspect", "copy", 0.0)]).outcome == "not measured"
    assert rules.destroyed(GOLDEN[1:] + [acc("node-01", "suspect", "match", 0.2)]).outcome == "not measured"
    v = rules.destroyed(GOLDEN + TWINS + [acc("node-01", "suspect", "copy", 0.26)])
    assert v.outcome == "not reproduced" and "node-01" in v.unstable


def dis(
    label: str, disagreement: float, *, twin: str = "golden-twin", baseline: float = 0.10, task: str = "copy"
) -> Row:
    """One rq3_finetune_disagreement row: `label`'s pair, whose baseline is shuffle-seed twin `twin`."""
    return {
        "suspect_node": label,
        "twin_node": twin,
        "task": task,
        "disagreement": disagreement,
        "baseline_disagreement": baseline,
        "suspect_accuracy": 0.6,
    }


# five twins, each the baseline of some pairs (they take turns): their disagreements with golden
TWIN_BASELINES = {
    "golden-twin": 0.10,
    "golden-twin-2": 0.08,
    "golden-twin-3": 0.12,
    "golden-twin-4": 0.09,
    "golden-twin-5": 0.14,
}
TWINS_IN_TURN = list(TWIN_BASELINES.items()) * 2


def pairs(disagreements: list[float]) -> list[Row]:
    return [
        dis(f"node-{i:02d}", d, twin=t, baseline=b)
        for i, (d, (t, b)) in enumerate(zip(disagreements, TWINS_IN_TURN), 1)
    ]


def test_disagreement_counts_results_outside_the_twins_range_against_a_binomial_bound() -> None:
    v = rules.disagreement(pairs([0.10] * 10))
    assert v.outcome == "reproduced" and not v.unstable and "0 of 10" in v.ours and "5 shuffle-seed" in v.ours
    assert "8 %-14 %" in v.ours and "at most 6 expected" in v.ours  # binomial_upper(10, 2/6)
    v = rules.disagreement(pairs([0.5] * 10))
    assert v.outcome == "not reproduced" and "10 above it" in v.ours
    assert rules.disagreement([dis("golden-twin-2", 0.1)]).outcome == "not measured"  # no fleet node
    assert rules.disagreement([dis("node-01", 0.1, twin="node-00")]).outcome == "not measured"  # no twin baseline
    edge = pairs([0.10] * 3 + [0.5] * 6 + [0.145])  # 7 outside, bound 6, one of them within a point of the top
    v = rules.disagreement(edge)
    assert v.outcome == "not reproduced" and "within the margin" in v.unstable


# -- provenance ----------------------------------------------------------------------------------


def rule(
    label: str,
    kind: str = "bitflip",
    *,
    ops: str = '["matmul"]',
    p_call: float = 1e-3,
    p_enter: float | None = None,
    factor: tuple[float, float] | None = None,
    bits: str | None = "mantissa",
    roles: str | None = None,
    steps: str | None = None,
) -> Row:
    """One rq1_fleet_profiles row."""
    return {
        "node_label": label,
        "kind": kind,
        "ops": ops,
        "p_call": p_call,
        "p_enter": p_enter,
        "p_exit": None,
        "factor_min": factor[0] if factor else None,
        "factor_max": factor[1] if factor else None,
        "bits": bits,
        "flips": None,
        "value": None,
        "roles": roles,
        "steps": steps,
    }


def test_provenance_follows_the_fault_rules() -> None:
    drawn = [
        rule("node-01", p_call=1e-6, p_enter=0.3),
        rule("node-02", p_call=1e-2, p_enter=0.3),
        rule("node-02", "scale", ops='["softmax"]', p_call=1e-4, factor=(100.0, 1000.0), bits=None),
        rule("node-02", "stuck", ops='["matmul"]', p_call=1.0, roles='["finetune"]', steps="[60]", bits=None),
        rule("node-00", "bitflip", p_call=0.0),
    ]
    assert prov.rate_spread(drawn).kind == "built in"
    assert prov.injected_counts(drawn).kind == "built in"
    assert prov.heavy_tail(drawn).kind == "built in"
    assert prov.outside_matmul(drawn).kind == "built in"
    assert prov.tail_rate(drawn).kind == "calibrated"
    assert prov.scripted_destroyer(drawn).kind == "built in"
    assert prov.small_flips([rule("node-01"), rule("node-02")]).kind == "built in"
    plain = [rule("node-01", bits="30"), rule("node-02", bits="30")]  # steady, alike, one bit, matmul only
    assert prov.injected_counts(plain).kind == "built in"  # its rule reads the injected faults back
    for decide in (
        prov.rate_spread,
        prov.small_flips,
        prov.heavy_tail,
        prov.outside_matmul,
        prov.tail_rate,
        prov.scripted_destroyer,
        prov.emergent,
    ):
        assert decide(plain).kind == "emergent", decide.__name__


def test_every_finding_names_a_rule_with_a_margin() -> None:
    for f in FINDINGS:
        assert "margin" in f.rule, f.study


def test_the_table_shows_provenance_and_unstable_rows(tmp_path: Path) -> None:
    missing = build_reproduction({"rq1": tmp_path / "none.duckdb"})
    assert all(r.verdict.outcome == "not measured" and r.provenance.kind == "unknown" for r in missing.rows)
    finding = FINDINGS[0]
    rep = Reproduction(
        (
            reproduction.Row(
                finding,
                rules.Verdict("2 of 5", "reproduced", "a node within the margin"),
                prov.Provenance("built in", "rates span 1e4x"),
            ),
        )
    )
    text = to_markdown(rep, "t")
    assert "| built in: rates span 1e4x | **consistent** (unstable: a node within the margin) |" in text
    assert "Totals: recovery rows: 1 consistent; 1 unstable." in text and "Provenance: 1 built in;" in text


# -- bugs ----------------------------------------------------------------------------------------


def test_drift_rates_without_an_sdc_rate_ratio_is_not_measured() -> None:
    v = rules.drift_rates([spread(sdc_rate_ratio=None, sdc_rate_decades=None)])
    assert v.outcome == "not measured" and "SDC rates" in v.ours


def test_heavy_tail_counts_a_nan_as_heavy() -> None:
    v = rules.heavy_tail([rq1("node-01", max_rel=math.nan), rq1("node-02", max_rel=1)])
    assert v.outcome == "reproduced" and "node" in v.ours and "1 of them by an Inf or NaN" in v.ours
