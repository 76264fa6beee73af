"""Every threshold and margin of the reproduction rules, pinned from both sides: a value just passing, one just failing.

tests/analysis/test_reproduction_rules.py makes each rule give each outcome; this file puts inputs on each side of
every number a rule compares with, so that changing the number or its comparison (tools/mutate_rules.py does, one
change at a time) fails a test. Rows come from that file's builders, with the columns of each judge's query.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from analysis import reproduction_rules as rules
from analysis import reproduction_stats as stats
from tests.analysis.test_reproduction_rules import GOLDEN, TWINS, Row, acc, dis, pairs, rq1, rq2, rq3, spike, spread


def one_near(v: rules.Verdict) -> bool:
    """An unstable count verdict with exactly one node within its margin."""
    return v.unstable.startswith("1 node(s) within the margin")


# -- RQ1 -----------------------------------------------------------------------------------------

BUSY = [rq1(f"node-{i}", calls=5, steps=2, faults=5) for i in range(10, 24)]  # mismatching, not frequent, not near


def silent(count: int, *, total: int = 5, **kw: object) -> list[Row]:
    return [rq1(f"node-0{i + 1}", **kw) for i in range(count)] + BUSY[: total - count]  # type: ignore[arg-type]  # rq1 keywords


def test_silent_nodes_accepts_one_to_the_binomial_upper_end() -> None:
    assert stats.binomial_interval(5, 2 / 15) == (0, 2)  # so 5 nodes accept 1-2 (at least 1 by the rule)
    assert [rules.silent_nodes(silent(k)).outcome for k in range(4)] == [
        "not reproduced",
        "reproduced",
        "reproduced",
        "not reproduced",
    ]
    assert "accepted 1-2" in rules.silent_nodes(silent(1)).ours
    assert "accepted 1-4" in rules.silent_nodes(silent(1, total=10)).ours  # binomial_interval(10, 2/15) = (0, 4)


def test_the_study_share_is_2_of_15() -> None:
    # 14 nodes tell 2/15 (accepted 0-5) from 2/16 (0-4), 2/30, 2/7, 3/15, 1/15 and 4/15
    assert "accepted 1-5" in rules.silent_nodes(silent(1, total=14)).ours
    assert "accepted 1-5" in rules.frequent_nodes(silent(1, total=14)).ours


def test_a_verdict_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        rules.silent_nodes(silent(1)).outcome = "reproduced"  # type: ignore[misc]  # frozen: it must raise


def test_silent_nodes_margin_is_faults_without_a_mismatch_or_exactly_one_mismatch() -> None:
    assert not rules.silent_nodes(silent(1)).unstable
    assert one_near(rules.silent_nodes(silent(1, faults=1)))  # it had a fault: it could leave, 0 silent
    assert not rules.silent_nodes(silent(2)[:1] + silent(2, faults=1)[1:2] + BUSY[:3]).unstable  # 1-2: no change
    one = silent(2)[:-1] + [rq1("node-09", calls=1, steps=1, faults=1)]  # could join: 3 silent
    assert one_near(rules.silent_nodes(one))
    two = silent(2)[:-1] + [rq1("node-09", calls=2, steps=1, faults=1)]
    assert not rules.silent_nodes(two).unstable


def frequent(steps: int) -> list[Row]:
    return [rq1("node-01", calls=30, steps=steps), *BUSY[:4]]


def test_frequent_nodes_need_half_the_steps_with_a_step_either_side_as_margin() -> None:
    assert rules.frequent_nodes(frequent(12)).outcome == "reproduced"  # 12 of 24: half
    assert rules.frequent_nodes(frequent(11)).outcome == "not reproduced"
    assert one_near(rules.frequent_nodes(frequent(13))) and one_near(rules.frequent_nodes(frequent(11)))
    assert not rules.frequent_nodes(frequent(14)).unstable and not rules.frequent_nodes(frequent(10)).unstable
    three = [rq1(f"node-0{i}", calls=30, steps=20) for i in range(1, 4)] + BUSY[:2]
    assert rules.frequent_nodes(three).outcome == "not reproduced"  # 3 of 5: above the interval
    assert rules.frequent_nodes(three[1:]).outcome == "reproduced"


def test_frequent_nodes_spread_is_over_the_nodes_with_a_mismatch() -> None:
    rows = [{**rq1("node-01", calls=30, steps=20), "frequency": 1e-3}, {**BUSY[0], "frequency": 1e-5}, rq1("node-09")]
    assert "spans 100x across the nodes with any" in rules.frequent_nodes(rows).ours
    one_call = [*rows[:1], {**rq1("node-02", calls=1, steps=1), "frequency": 1e-5}]
    assert "spans 100x" in rules.frequent_nodes(one_call).ours
    rows[1]["frequency"] = 0.0
    assert "spans" not in rules.frequent_nodes(rows).ours


BOUND = stats.poisson_fano_bound(24)


def burst(label: str, ratio: float, *, fault_steps: int = 3) -> Row:
    return rq1(label, faults=10, fault_steps=fault_steps, fault_fano=BOUND * ratio)


def test_bursts_need_a_fano_factor_above_the_bound_on_more_than_half() -> None:
    assert rules.bursts([burst("node-01", 1.001), burst("node-02", 0.5)]).outcome == "not reproduced"  # 1 of 2
    assert rules.bursts([burst("node-01", 1.2), burst("node-02", 1.2), burst("node-03", 0.5)]).outcome == "reproduced"
    assert rules.bursts([burst("node-01", 1.2)]).outcome == "reproduced"
    assert rules.bursts([burst("node-01", 1.0)]).outcome == "not reproduced"  # at the bound: not above it
    assert rules.bursts([burst("node-01", 1.2, fault_steps=1)]).outcome == "not measured"
    assert rules.bursts([burst("node-01", 1.2, fault_steps=2)]).outcome == "reproduced"


def test_bursts_margin_is_ten_percent_of_the_bound() -> None:
    assert one_near(rules.bursts([burst("node-01", 1.09)])) and one_near(rules.bursts([burst("node-01", 0.91)]))
    assert not rules.bursts([burst("node-01", 1.11)]).unstable
    assert not rules.bursts([burst("node-01", 0.89)]).unstable


def test_small_is_a_median_below_one_percent_with_a_factor_two_margin() -> None:
    def v(*severities: float) -> rules.Verdict:
        return rules.small([rq1(f"node-0{i}", severity=s) for i, s in enumerate(severities, 1)])

    assert v(0.0099).outcome == "reproduced" and v(0.01).outcome == "not reproduced"
    assert v(0.001, 0.0099, 0.5).outcome == "reproduced"  # the median, not the worst
    assert v(0.005).unstable and v(0.02).unstable
    assert not v(0.0049).unstable and not v(0.0201).unstable


def test_heavy_tail_is_100x_or_more_with_a_factor_one_and_a_quarter_margin() -> None:
    def v(max_rel: float) -> rules.Verdict:
        return rules.heavy_tail([rq1("node-01", max_rel=max_rel), rq1("node-02", max_rel=1)])

    assert v(100).outcome == "reproduced" and v(99.9).outcome == "not reproduced"
    assert one_near(v(80)) and one_near(v(125))
    assert not v(79.9).unstable and not v(125.1).unstable
    assert "1 of them by an Inf or NaN" in v(float("inf")).ours and "largest finite 1x" in v(float("inf")).ours
    assert v(100).outcome == "reproduced" and "Inf" not in v(100).ours
    unknown = rules.heavy_tail([{**rq1("node-01"), "max_rel": None}])
    assert unknown.outcome == "not reproduced" and "largest finite 0x" in unknown.ours
    assert "largest finite 0x" in rules.heavy_tail([rq1("node-01", max_rel=float("inf"))]).ours


def recall(*values: float, faults: int = 10) -> list[Row]:
    return [rq1(f"node-0{i}", faults=faults, recall=r, outside=5, below=2) for i, r in enumerate(values, 1)]


def test_abft_needs_recall_below_a_half_on_more_than_half_the_nodes_with_faults() -> None:
    assert rules.abft(recall(0.49)).outcome == "reproduced" and rules.abft(recall(0.5)).outcome == "not reproduced"
    assert rules.abft(recall(0.1, 0.9)).outcome == "not reproduced"  # 1 of 2
    assert rules.abft(recall(0.1, 0.1, 0.9)).outcome == "reproduced"
    assert rules.abft(recall(0.1, faults=1)).outcome == "reproduced"
    assert rules.abft(recall(0.1, faults=0)).outcome == "not measured"
    v = rules.abft(recall(0.1, 0.9))
    assert "(50 %)" in v.ours and "50 % were outside matmul and 20 % below its bound" in v.ours


def test_abft_margin_is_a_tenth_either_side_of_a_half() -> None:
    assert one_near(rules.abft(recall(0.6))) and one_near(rules.abft(recall(0.4)))
    assert not rules.abft(recall(0.61)).unstable and not rules.abft(recall(0.39)).unstable


# -- RQ2 -----------------------------------------------------------------------------------------


def noise(median: float, worst: float) -> rules.Verdict:
    return rules.noise([rq2("node-01", 0.0), rq2("node-02", median), rq2("node-03", worst)])


def test_noise_needs_a_median_below_one_percent_and_the_worst_within_a_factor_two_of_5_1_percent() -> None:
    assert noise(0.0099, 0.05).outcome == "reproduced" and noise(0.01, 0.05).outcome == "not reproduced"
    assert noise(0.001, 0.0255).outcome == "reproduced" and noise(0.001, 0.0254).outcome == "different"
    assert noise(0.001, 0.102).outcome == "reproduced" and noise(0.001, 0.1021).outcome == "different"


def test_noise_margins_are_a_factor_one_and_a_quarter_around_each_bound() -> None:
    assert noise(0.0081, 0.05).unstable and noise(0.0124, 0.05).unstable
    assert not noise(0.0079, 0.05).unstable and not noise(0.0126, 0.05).unstable
    assert noise(0.001, 0.0205).unstable and noise(0.001, 0.0318).unstable
    assert not noise(0.001, 0.0203).unstable and not noise(0.001, 0.032).unstable
    assert noise(0.001, 0.0817).unstable and noise(0.001, 0.1274).unstable
    assert not noise(0.001, 0.0815).unstable and not noise(0.001, 0.1276).unstable


# -- RQ3 pretraining -----------------------------------------------------------------------------

FLOOR = rules.UNIT_ROUNDOFF
TWIN = rq3("golden-twin", "baseline", loss=0.06, drift=0.16)


def overlap(*drifts: float, loss: float = 0.01, healthy: float = 0.0) -> rules.Verdict:
    nodes = [rq3(f"node-0{i}", "fleet", faults=5, loss=loss, drift=d) for i, d in enumerate(drifts, 1)]
    return rules.overlap([TWIN, rq3("node-00", "healthy", drift=healthy), *nodes])


def test_overlap_needs_loss_within_the_twins_and_drift_above_the_floor_on_more_than_half() -> None:
    assert overlap(1e-3, loss=0.06).outcome == "reproduced" and overlap(1e-3, loss=0.0601).outcome == "not reproduced"
    assert overlap(FLOOR * 1.001).outcome == "reproduced" and overlap(FLOOR).outcome == "not reproduced"
    assert overlap(1e-3, 0.0).outcome == "not reproduced"  # 1 of 2
    assert overlap(1e-3, 1e-3, 0.0).outcome == "reproduced"
    no_faults = rules.overlap([TWIN, rq3("node-01", "fleet", faults=0, loss=0.01, drift=1e-3)])
    assert no_faults.outcome == "not measured"


def test_drift_floor_is_the_healthy_twins_drift_only_above_the_unit_roundoff() -> None:
    assert rules.UNIT_ROUNDOFF == 2.0**-24
    assert rules.drift_floor([rq3("node-00", "healthy", drift=FLOOR)]) == (
        FLOOR,
        "float32's unit roundoff 2^-24 (the healthy twin drifts 5.96e-08)",
    )
    above = FLOOR * 1.001
    assert rules.drift_floor([rq3("node-00", "healthy", drift=above)])[0] == above
    assert rules.drift_floor([rq3("node-00", "fleet", drift=1.0)]) == (FLOOR, "float32's unit roundoff 2^-24")


def test_overlap_margins_are_a_factor_one_and_a_quarter_on_loss_and_two_on_drift() -> None:
    assert overlap(1e-3, loss=0.06 / 1.25 * 1.001).unstable and not overlap(1e-3, loss=0.06 / 1.25 * 0.999).unstable
    assert not overlap(1e-3, loss=0.0).unstable
    same = rules.overlap([{**TWIN, "mean_abs_loss_diff": 0.0}, rq3("node-01", "fleet", faults=5, drift=1e-3)])
    assert same.outcome == "reproduced" and not same.unstable  # no loss difference at all is not "near" one
    assert "median final drift 0.001" in overlap(1e-3).ours
    unknown = rq3("node-02", "fleet", faults=1, loss=0.01, drift=None)  # type: ignore[arg-type]  # a missing drift
    v = rules.overlap([TWIN, rq3("node-01", "fleet", faults=1, loss=0.01, drift=0.0), unknown])
    assert "0 of 2 nodes drift" in v.ours and "median final drift 0," in v.ours  # one fault is enough to count
    assert one_near(overlap(FLOOR * 2 * 0.999)) and not overlap(FLOOR * 2 * 1.001).unstable
    assert one_near(overlap(1e-3, FLOOR / 2 * 1.001))  # 1 of 2: the near one could join
    assert not overlap(1e-3, FLOOR / 2 * 0.999).unstable
    assert not overlap(1e-3, 1e-3, FLOOR / 2 * 1.001).unstable  # 2 of 3 already: joining changes nothing
    assert not overlap(1e-3, FLOOR / 2 * 1.001, loss=0.1).unstable
    assert (
        overlap(FLOOR * 2).unstable and overlap(1e-3, FLOOR / 2).unstable
    )  # the factor 2 is inclusive  # the loss decides (outside its margin)


def test_drift_rates_span_at_most_3x_while_sdc_rates_span_10x() -> None:
    assert rules.drift_rates([spread(rate_ratio=3.0)]).outcome == "reproduced"
    assert rules.drift_rates([spread(rate_ratio=3.01)]).outcome == "not reproduced"
    assert rules.drift_rates([spread(sdc_rate_ratio=10.0)]).outcome == "reproduced"
    assert rules.drift_rates([spread(sdc_rate_ratio=9.99)]).outcome == "not measured"
    assert rules.drift_rates([spread(nodes=2)]).outcome == "reproduced"
    assert rules.drift_rates([spread(nodes=None)]).outcome == "not measured"
    assert "e-fold every 10 steps" in rules.drift_rates([spread()]).ours


def test_drift_rates_margin_is_ten_percent_of_3x() -> None:
    assert (
        rules.drift_rates([spread(rate_ratio=2.73)]).unstable and rules.drift_rates([spread(rate_ratio=3.29)]).unstable
    )
    assert not rules.drift_rates([spread(rate_ratio=2.72)]).unstable
    assert not rules.drift_rates([spread(rate_ratio=3.31)]).unstable


def test_trigger_grows_at_half_to_twice_the_median_rate_with_ten_percent_margins() -> None:
    def v(x: float) -> rules.Verdict:
        return rules.trigger([spread(trigger_over_median=x)])

    assert [v(x).outcome for x in (0.49, 0.5, 2.0, 2.01)] == [
        "not reproduced",
        "reproduced",
        "reproduced",
        "not reproduced",
    ]
    assert all(v(x).unstable for x in (0.46, 0.54, 1.82, 2.19))
    assert not any(v(x).unstable for x in (0.45, 0.56, 1.81, 2.21))
    assert rules.trigger([spread(median_rate=0.0)]).outcome == "not measured"


def sharp(rates: list[float]) -> list[Row]:
    return [{"sharpness": float(i), "local_median_rate": r} for i, r in enumerate(rates, 1)]


def rotated(k: int, n: int = 20) -> list[Row]:
    """n checkpoints whose rates are a rotation of a step-7 permutation: rho from -0.23 to 0.37."""
    return sharp([float((i * 7 + k) % n) for i in range(n)])


def test_sharpness_decides_by_its_interval_against_0_and_follows() -> None:
    assert rules.MIN_CHECKPOINTS == 4 and rules.FOLLOWS == 0.3
    assert rules.sharpness(sharp([1, 2, 3, 4])).outcome != "not measured"
    assert rules.sharpness(sharp([1, 2, 3, 4]) + [{"sharpness": None, "local_median_rate": 1.0}]).outcome == (
        "reproduced"
    )
    assert rules.sharpness(sharp([1, 2, 3]) + [{"sharpness": 4.0, "local_median_rate": None}]).outcome == (
        "not measured"
    )
    v = rules.sharpness(rotated(9))  # rho -0.22, interval -0.61 to 0.26: below FOLLOWS
    assert v.outcome == "not reproduced" and not v.unstable
    v = rules.sharpness(rotated(11))  # rho -0.16, interval -0.57 to 0.32: reaches above FOLLOWS
    assert v.outcome == "not reproduced" and "undecided" in v.unstable
    v = rules.sharpness(rotated(0))  # rho 0.37, interval -0.10 to 0.70
    assert v.outcome == "reproduced" and "undecided" in v.unstable
    v = rules.sharpness(sharp([1.0] * 6))  # rho 0: undecided, and not positive
    assert v.outcome == "not reproduced" and "undecided" in v.unstable


def test_spikes_from_the_scripted_step_on_are_apart_with_a_1_65x_margin() -> None:
    # at and after a node's first scripted step its spikes are the script's, whatever drawn fault fired near them
    assert rules.spikes([spike("node-03", "fleet", faults=2, scripted=1)]).outcome == "not reproduced"
    assert rules.spikes([spike("node-03", "fleet", faults=1, scripted=1)]).outcome == "not reproduced"
    assert rules.spikes([spike("node-03", "fleet", faults=1, step=6, scripted_from=7)]).outcome == "reproduced"
    assert rules.spikes([spike("node-03", "fleet", faults=1, step=7, scripted_from=7)]).outcome == "not reproduced"
    assert rules.spikes([spike("node-03", "fleet", faults=1, scripted_from=None)]).outcome == "reproduced"
    # the healthy twins' spikes decide against the finding; a twin's within the margin makes it unstable
    twin = [spike("node-03", "fleet", faults=2)]
    assert rules.spikes([*twin, spike("golden-twin-2", "baseline", ratio=1.64)]).unstable
    assert not rules.spikes([*twin, spike("golden-twin-2", "baseline", ratio=1.66)]).unstable
    assert not rules.spikes([spike("golden-twin-2", "baseline", ratio=1.64)]).unstable  # no counted spike
    assert rules.spikes([*twin, spike("golden-twin-2", "baseline", golden=True)]).outcome == "reproduced"
    apart = rules.spikes([spike("node-03", "fleet", faults=1, scripted=1)])
    assert "reported apart and not counted: 1 of node-03" in apart.ours
    assert "reported apart" not in rules.spikes([spike("node-03", "fleet", faults=1)]).ours
    assert rules.spikes([spike("node-03", "fleet", faults=2, ratio=1.64)]).unstable
    assert not rules.spikes([spike("node-03", "fleet", faults=2, ratio=1.66)]).unstable
    assert not rules.spikes([spike("node-03", "fleet", faults=2, ratio=1.5 * rules.SPIKE_MARGIN)]).unstable
    assert "shuffle-seed twins 0;" in rules.spikes([spike("node-03", "fleet", faults=2)]).ours
    assert not rules.spikes([spike("node-03", "fleet", faults=2, ratio=None)]).unstable  # type: ignore[arg-type]  # no ratio
    both = [spike("node-03", "fleet", faults=2, ratio=1.6), spike("node-04", "fleet", faults=2, ratio=2.0)]
    assert not rules.spikes(both).unstable  # one clear spike is enough
    assert "spikes golden has too: 1" in rules.spikes([spike("node-03", "fleet", golden=True, faults=2)]).ours


def test_spike_window_is_the_querys() -> None:
    sql = (Path(__file__).parents[2] / "analysis" / "queries" / "rq3_loss_spikes.sql").read_text()
    assert f"s.step - {rules.SPIKE_WINDOW} AND s.step" in sql


# -- RQ3 fine-tuning -----------------------------------------------------------------------------


def test_learnt_tasks_need_ten_points_above_chance_and_no_collapse() -> None:
    assert rules.LEARNT == 0.10
    assert rules.learnt_tasks([acc("golden", "golden", "copy", 0.36)]) == {"copy"}
    assert rules.learnt_tasks([acc("golden", "golden", "copy", 0.34)]) == set()
    assert rules.learnt_tasks([acc("golden", "golden", "copy", 0.35)]) == {"copy"}  # 0.25 + 0.10 is 0.35
    assert rules.learnt_tasks([{**acc("golden", "golden", "copy", 0.9), "collapsed": True}]) == set()
    assert rules.learnt_tasks([acc("golden-twin", "twin", "copy", 0.9)]) == set()


def test_accuracy_counts_results_strictly_below_the_lowest_twin_with_a_one_point_margin() -> None:
    at = [acc(f"node-{i:02d}", "suspect", "copy", 0.78) for i in range(1, 11)]  # the lowest twin's 78 %: not below
    assert rules.accuracy(GOLDEN + TWINS + at).outcome == "reproduced"
    under = [acc(f"node-{i:02d}", "suspect", "copy", 0.5 if i <= 5 else 0.8) for i in range(1, 11)]
    assert rules.accuracy(GOLDEN + TWINS + under).outcome == "reproduced"  # 5 below, the bound 5
    under[5] = acc("node-06", "suspect", "copy", 0.5)
    assert rules.accuracy(GOLDEN + TWINS + under).outcome == "not reproduced"  # 6 below
    near = under[:5] + [acc(f"node-{i:02d}", "suspect", "copy", 0.785) for i in range(6, 11)]
    assert rules.accuracy(GOLDEN + TWINS + near).unstable  # within a point of the lowest twin's 0.78: could fall
    far = under[:5] + [acc(f"node-{i:02d}", "suspect", "copy", 0.795) for i in range(6, 11)]
    assert not rules.accuracy(GOLDEN + TWINS + far).unstable
    assert one_near(rules.accuracy(GOLDEN + TWINS + under[:5] + far[5:6] + near[5:6] + far[7:]))
    sort = [acc("golden", "golden", "sort", 0.9)] + [
        acc(label, "suspect", "sort", a)
        for label, a in (("golden-twin", 0.4), ("golden-twin-2", 0.5), ("golden-twin-3", 0.45))
    ]
    assert "copy 78 %-82 %, sort 40 %-50 %" in rules.accuracy(GOLDEN + TWINS + sort + far).ours  # each task's own
    # the margin is inclusive: 0.02 - 0.01 is exactly 0.01 in floats
    floor = [acc("golden", "golden", "c", 0.8, chance=0.0)] + [
        acc(label, "suspect", "c", a, chance=0.0)
        for label, a in (("golden-twin", 0.02), ("golden-twin-2", 0.5), ("golden-twin-3", 0.6))
    ]
    six = [acc(f"node-{i:02d}", "suspect", "c", a, chance=0.0) for i, a in enumerate([0.005] * 5 + [0.01] + [0.8] * 4)]
    v = rules.accuracy(floor + six)
    assert v.outcome == "not reproduced" and one_near(v)
    collapsed = [acc(f"node-{i}", "suspect", "copy", 0.25) for i in range(21, 23)]
    v = rules.accuracy(GOLDEN + TWINS + at + collapsed)
    assert "0 of 10" in v.ours and "left out: node-21, node-22" in v.ours
    kept = [{**acc("node-31", "suspect", "copy", 0.26), "collapsed": True}]
    assert "1 of 11" in rules.accuracy(GOLDEN + TWINS + at + kept).ours


def test_disagreement_range_is_inclusive_with_a_one_point_margin_and_needs_accuracy_above_a_quarter() -> None:
    assert rules.disagreement(pairs([0.08] * 7 + [0.14] * 3)).outcome == "reproduced"  # the range's ends: inside
    assert rules.disagreement(pairs([0.08] * 3 + [0.14] * 7)).outcome == "reproduced"
    v = rules.disagreement(pairs([0.10] * 4 + [0.079] * 6))
    assert v.outcome == "reproduced" and "6 of 10" in v.ours and "0 above it" in v.ours  # bound 6
    v = rules.disagreement(pairs([0.10] * 3 + [0.141] * 7))
    assert v.outcome == "not reproduced" and "7 above it" in v.ours
    assert one_near(rules.disagreement(pairs([0.10] * 3 + [0.5] * 6 + [0.131])))  # 6 outside; 0.131 near 0.14
    assert not rules.disagreement(pairs([0.10] * 3 + [0.5] * 6 + [0.129])).unstable
    assert one_near(rules.disagreement(pairs([0.10] * 3 + [0.5] * 6 + [0.089])))  # 0.089: a point from 0.08
    assert not rules.disagreement(pairs([0.10] * 3 + [0.5] * 6 + [0.091])).unstable
    # the margin is inclusive: 0.02 - 0.01 is exactly 0.01 in floats
    twins = [("golden-twin", 0.02), ("golden-twin-2", 0.1), ("golden-twin-3", 0.1), ("golden-twin-4", 0.2)] * 3
    d = [0.1] * 2 + [0.5] * 7 + [0.01]  # 8 outside the 4 twins' 0.02-0.2, the bound binomial_upper(10, 2/5) 7
    v = rules.disagreement([dis(f"node-{i}", x, twin=t, baseline=b) for i, (x, (t, b)) in enumerate(zip(d, twins))])
    assert v.outcome == "not reproduced" and one_near(v)
    assert "0 above it" in rules.disagreement(pairs([0.14] * 10)).ours  # the top of the range is inside
    two = [dis(f"node-{i:02d}", 0.5, twin=t, baseline=b) for i, (t, b) in enumerate([("golden-twin", 0.1)] * 9, 1)]
    two.append(dis("node-10", 0.5, twin="golden-twin-2", baseline=0.12))
    assert "at most 9 expected" in rules.disagreement(two).ours  # 2 twins: p = 2/3 (a probability below 1)
    assert "median disagreement" not in rules.disagreement([dis("node-01", 0.2, baseline=0.0)]).ours
    quarter = [{**r, "suspect_accuracy": 0.25} for r in pairs([0.10] * 10)]
    assert rules.disagreement(quarter).outcome == "not measured"
    assert rules.disagreement([{**r, "suspect_accuracy": 0.26} for r in quarter]).outcome == "reproduced"
    v = rules.disagreement([dis("node-01", 0.2, baseline=0.1)])
    assert "median disagreement / the twins' median 2" in v.ours


def test_destroyed_needs_accuracy_at_or_below_chance_with_a_two_point_margin() -> None:
    def v(*nodes: Row) -> rules.Verdict:
        return rules.destroyed(GOLDEN + TWINS + list(nodes))

    assert v(acc("node-01", "suspect", "copy", 0.25)).outcome == "reproduced"
    assert v(acc("node-01", "suspect", "copy", 0.26)).outcome == "not reproduced"
    assert v({**acc("node-01", "suspect", "copy", 0.2), "collapsed": False}).outcome == "not reproduced"
    assert not v({**acc("node-01", "suspect", "copy", 0.25), "collapsed": False}).unstable  # at chance: not above
    twin_at = [acc("golden-twin-4", "suspect", "copy", 0.35)]  # learnt: 0.25 + 0.10
    assert rules.destroyed(GOLDEN + TWINS + twin_at + [acc("node-01", "suspect", "copy", 0.0)]).outcome == (
        "reproduced"
    )
    assert (
        v(acc("node-01", "suspect", "copy", 0.27)).unstable and not v(acc("node-01", "suspect", "copy", 0.28)).unstable
    )
    weak_twin = [acc("golden-twin-4", "suspect", "copy", 0.34)]
    assert rules.destroyed(GOLDEN + TWINS + weak_twin + [acc("node-01", "suspect", "copy", 0.0)]).outcome == (
        "not measured"
    )
    many = [acc(f"node-{i:02d}", "suspect", "copy", 0.0) for i in range(1, 9)]
    out = v(*many).ours
    assert "node-06 copy" in out and "node-07 copy" not in out and "; 2 more" in out
    assert "more" not in v(*many[:6]).ours and "; 1 more" in v(*many[:7]).ours
