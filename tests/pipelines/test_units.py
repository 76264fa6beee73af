"""The pipeline's pure parts: the join of one bucket, scoring, loss spikes, drift, pairing, run description."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path

import pytest
import torch

from pipelines.events import Fault, fault_units
from pipelines.log_source import RankLayout, RunLayout, bucket_batches, describe_run
from pipelines.loss_and_drift import (
    SPIKE_FACTOR,
    SPIKE_MIN_HISTORY,
    SPIKE_WINDOW,
    drift_rows,
    loss_tables,
    parameter_group,
    spikes,
)
from pipelines.pairing import differences, pair_id, validate_pair
from pipelines.tensor_diff import diff_bucket
from tests.pipelines.test_transforms import B, F, G, P, columns
from tracer.errors import LogFormatError, ValidationError
from tracer.log import NO_MICROBATCH, SCHEMA_VERSION, LogWriter, Phase, RunHeader, rank_dir


def batch(records):
    return [b for _, b in bucket_batches(columns(records), 0, 1_000_000)]


def rows(result, *cols):
    return [tuple(r[c] for c in cols) for r in result.event_diffs.to_pylist()]


def test_repeated_calls_of_one_site_pair_up_in_log_order() -> None:
    golden = [(0, 0, "a", F, 1), (0, 0, "a", F, 2), (0, 0, "b", F, 3)]
    suspect = [(0, 0, "a", F, 1), (0, 0, "a", F, 9)]
    result = diff_bucket(0, batch(golden), batch(suspect), bound=10)
    assert rows(result, "name", "occurrence", "status", "golden_fingerprint", "suspect_fingerprint") == [
        ("a", 0, "equal", 1, 1),
        ("a", 1, "differ", 2, 9),
        ("b", 0, "golden_only", 3, None),
    ]


def test_execution_order_puts_step_level_phases_after_every_microbatch() -> None:
    # A gradient says the microbatch that last changed it (1), or none (an all-reduce after the microbatches).
    none = NO_MICROBATCH
    golden = [
        (0, 0, "in", Phase.INPUT, 1),
        (0, 0, "a", F, 2),
        (0, 0, "a", B, 3),
        (0, 1, "a", F, 4),
        (0, none, "sum.all_reduce.out", G, 7),
        (0, 1, "w", G, 5),
        (0, 0, "w", P, 6),
    ]
    suspect = [
        (0, 0, "in", Phase.INPUT, 1),
        (0, 0, "a", F, 2),
        (0, 0, "a", B, 3),
        (0, 1, "a", F, 40),
        (0, none, "sum.all_reduce.out", G, 7),
        (0, 1, "w", G, 50),
        (0, 0, "w", P, 60),
    ]
    result = diff_bucket(0, batch(golden), batch(suspect), bound=10)
    assert [(r[1], r[3]) for r in rows(result, "step", "microbatch", "name", "phase")] == [
        (0, "input"),
        (0, "forward"),
        (0, "backward"),
        (1, "forward"),
        (None, "grad"),
        (1, "grad"),
        (None, "param"),
    ]
    first = result.findings.first[1]
    assert (first["microbatch"], first["phase"], first["name"]) == (1, "forward", "a")
    (steps,) = result.divergence_steps.to_pylist()
    assert (steps["differing"], steps["sites_differing"], steps["grads_differing"], steps["params_differing"]) == (
        3,
        1,
        1,
        1,
    )


def fault(step: int, site: str, phase: str = "forward", mb: int = 0) -> Fault:
    return Fault(
        "suspect", 0, step, 0, 100 + step, mb, site, "aten.mm.default", phase, "bitflip", 1, [0], [1.0], [2.0], None
    )


def test_faults_are_located_at_the_longest_traced_prefix() -> None:
    sites = ["layers.1", "layers.1.attention", "layers.10.attention"]
    located = [
        (traced, phase)
        for _, traced, phase in fault_units(
            [
                fault(1, "layers.1.attention.wq"),
                fault(1, "layers.10.attention"),
                fault(1, "embed"),
                fault(1, "layers.1.attention", phase="backward"),
                fault(1, "layers.1.attention", phase="sideways"),
            ],
            sites,
        )
    ]
    assert located == [
        ("layers.1.attention", 0),
        ("layers.10.attention", 0),
        (None, None),
        ("layers.1.attention", 1),
        (None, None),
    ]


def test_fingerprint_scores_separate_unexplained_from_propagated_differences() -> None:
    golden = [(s, 0, site, ph, 1) for s in range(4) for site in ("a", "b") for ph in (F, B)]
    # step 0: "b" differs with no fault (fp); step 2: the fault at "a" (tp) and what follows (propagated)
    changed = {(0, "b", F), (2, "a", F), (2, "b", F), (3, "a", F)}
    suspect = [(s, m, n, ph, 2 if (s, n, ph) in changed else fp) for s, m, n, ph, fp in golden]
    faults = [fault(2, "a"), fault(1, "b", phase="backward"), fault(9, "a")]
    result = diff_bucket(0, batch(golden), batch(suspect), bound=3, faults=faults)
    units, tp, fp, fn, tn, propagated = result.findings.scores
    assert (units, tp, fp, fn, tn, propagated) == (16, 1, 1, 1, 11, 2)
    hits = {fid[3]: hit["fingerprint_detected"] for fid, hit in result.findings.fault_hits}
    assert hits == {102: True, 101: False}  # the fault at step 9 is beyond the comparison


def test_a_fault_in_a_sites_backward_is_located_at_the_gradients_of_all_its_inputs() -> None:
    """A fault in cross-attention's backward corrupts the gradients w.r.t. its query (a) and its memory (a[1])."""
    golden = [(0, 0, "a", F, 1), (0, 0, "a", B, 2), (0, 0, "a[1]", B, 3), (0, 0, "b", B, 4)]
    suspect = [(0, 0, "a", F, 1), (0, 0, "a", B, 20), (0, 0, "a[1]", B, 30), (0, 0, "b", B, 40)]
    result = diff_bucket(0, batch(golden), batch(suspect), bound=3, faults=[fault(0, "a", phase="backward")])
    units, tp, fp, fn, tn, propagated = result.findings.scores
    assert (units, tp, fp, fn, tn, propagated) == (4, 2, 0, 0, 1, 1)


def test_loss_spike_rule() -> None:
    losses = [2.0, 2.1, 1.9, 2.0, 2.05, 3.5, 2.0, math.nan, 2.0]
    found = spikes(list(range(len(losses))), losses)
    assert [(s["step"], s["baseline"]) for s in found] == [(5, 2.0), (7, 2.0)]
    assert found[0]["ratio"] == pytest.approx(3.5 / 2.0) and 3.5 > SPIKE_FACTOR * 2.0
    assert spikes([0, 1, 2], [1.0, 100.0, math.inf]) == [{"step": 2, "loss": math.inf, "baseline": None, "ratio": None}]


def _spikes_row_by_row(steps: list[int], losses: list[float | None]) -> list[dict]:
    """The spike rule (analysis/SCHEMA.md) as it reads, step by step."""
    out = []
    for i, (step, loss) in enumerate(zip(steps, losses)):
        if loss is None:
            continue
        history = [x for x in losses[max(0, i - SPIKE_WINDOW) : i] if x is not None and math.isfinite(x)]
        baseline = statistics.median(history) if len(history) >= SPIKE_MIN_HISTORY else None
        if not math.isfinite(loss):
            out.append({"step": step, "loss": loss, "baseline": baseline, "ratio": None})
        elif baseline is not None and loss > SPIKE_FACTOR * baseline:
            ratio = loss / baseline if baseline else None
            out.append({"step": step, "loss": loss, "baseline": baseline, "ratio": ratio})
    return out


@pytest.mark.parametrize("seed", range(4))
def test_loss_spikes_follow_the_rule_on_curves_with_gaps_and_non_finite_losses(seed: int) -> None:
    rng = random.Random(seed)
    losses: list[float | None] = []
    for i in range(600):
        value = rng.choice([2.0, 1.0, 0.0]) if i < 40 and seed % 2 else 2.0 + rng.gauss(0, 0.3)  # zero baselines too
        roll = rng.random()
        losses.append(
            None
            if roll < 0.05
            else rng.choice([math.nan, math.inf, -math.inf])
            if roll < 0.1
            else value * 2.5
            if roll < 0.15
            else value
        )
    steps = sorted(rng.sample(range(5000), len(losses)))
    assert repr(spikes(steps, losses)) == repr(_spikes_row_by_row(steps, losses))  # repr: NaN equals itself
    assert spikes([], []) == [] and spikes([3], [math.nan])[0]["baseline"] is None


def test_loss_table_pairs_the_curves_step_by_step() -> None:
    golden = {0: 2.0, 1: 0.0, 2: None, 3: math.nan}
    loss, spike = loss_tables(7, golden, {0: 2.5, 1: 1.0, 3: 1.0, 4: 3.0}, {0: 0.1, 1: None})
    rows = [
        (r["step"], r["golden_loss"], r["suspect_loss"], r["diff"], r["rel_diff"], r["lr"]) for r in loss.to_pylist()
    ]
    assert repr(rows) == repr(
        [
            (0, 2.0, 2.5, 0.5, 0.25, 0.1),
            (1, 0.0, 1.0, 1.0, None, None),
            (2, None, None, None, None, None),
            (3, math.nan, 1.0, math.nan, math.nan, None),
            (4, None, 3.0, None, None, None),
        ]
    )
    assert {r["rank"] for r in loss.to_pylist()} == {7}
    assert repr(spike.to_pylist()) == repr(
        [{"rank": 7, "step": 3, "side": "golden", "loss": math.nan, "baseline": None, "ratio": None}]
    )


def test_drift_is_relative_overall_and_per_layer() -> None:
    golden = {
        "layers.0.w": torch.ones(4),
        "layers.1.w": torch.ones(4) * 2,
        "embed.weight": torch.ones(2),
        "steps": torch.tensor([3]),
    }
    suspect = {**golden, "layers.1.w": torch.tensor([2.0, 2.0, 2.0, 3.0])}
    drift = {r["group"]: r for r in drift_rows(0, 5, golden, suspect)}
    assert set(drift) == {"*", "layers.0", "layers.1", "embed"}  # integer tensors are not parameters
    assert drift["layers.0"]["drift"] == 0.0 and drift["layers.1"]["drift"] == pytest.approx(1 / 4)
    assert drift["*"]["drift"] == pytest.approx(1 / math.sqrt(4 + 16 + 2)) and drift["*"]["elements"] == 10
    assert parameter_group("model.layers.12.mlp.w1.weight") == "model.layers.12"


def layout(path: str, ranks: dict[int, RunHeader]) -> RunLayout:
    return RunLayout(path, {r: RankLayout(r, h, ()) for r, h in ranks.items()}, 0)


HEADER = RunHeader(
    SCHEMA_VERSION,
    "g",
    "n",
    "train",
    2,
    0,
    {},
    "cfg",
    0,
    "data",
    "lanes64-v1",
    {},
    "cpu",
    {"intra_op_threads": 2},
    0.0,
    {},
)


def test_pairing_lists_every_difference_and_ids_are_deterministic() -> None:
    golden = layout("A", {0: HEADER, 1: dataclasses.replace(HEADER, rank=1)})
    suspect = layout("B", {0: dataclasses.replace(HEADER, run_id="s", seed=3), 1: dataclasses.replace(HEADER, rank=1)})
    assert differences(golden, suspect) == ["seed: 0 vs 3"]
    assert differences(golden, layout("C", {0: HEADER})) == ["ranks: [0, 1] vs [0]"]
    replay = layout("R", {0: dataclasses.replace(HEADER, run_id="r", role="replay")})
    validate_pair(golden, golden, [replay])  # a replay log of some ranks fits
    with pytest.raises(ValidationError, match=r"replay log T .*role: expected 'replay', found 'train'"):
        validate_pair(golden, golden, [layout("T", {0: HEADER})])
    assert pair_id(golden, suspect) == pair_id(golden, suspect) != pair_id(suspect, golden)


def test_describe_run_reads_a_header_larger_than_the_first_read(tmp_path: Path) -> None:
    big = dataclasses.replace(HEADER, world_size=1, config={"notes": "x" * 200_000})
    LogWriter(rank_dir(tmp_path / "run", 0), big).close()
    run = describe_run(str(tmp_path / "run"))
    assert run.header.config == big.config and run.bytes > 200_000
    with pytest.raises(LogFormatError, match="holds no log segments"):
        describe_run(str(tmp_path / "nothing"))


def test_a_bucket_only_one_run_has_is_all_one_sided() -> None:
    records = [(0, 0, "a", F, 1), (0, 0, "b", F, 2)]
    golden_only = diff_bucket(0, batch(records), [], bound=10)
    assert rows(golden_only, "status", "golden_fingerprint", "suspect_fingerprint", "suspect_offset") == [
        ("golden_only", 1, None, None),
        ("golden_only", 2, None, None),
    ]
    suspect_only = diff_bucket(0, [], batch(records), bound=10)
    assert rows(suspect_only, "status", "golden_fingerprint", "suspect_fingerprint", "meta") == [
        ("suspect_only", None, 1, "float32[4]"),
        ("suspect_only", None, 2, "float32[4]"),
    ]
    assert suspect_only.findings.first[1]["name"] == "a"


def test_the_row_join_and_the_key_join_give_the_same_tables() -> None:
    """Both runs hold the same keys in log order: rows pair by position. The same batches in another order
    take the join on keys; nothing in the tables may tell the two apart."""
    golden = [
        (0, 0, "in", Phase.INPUT, 1),
        (0, 0, "a", F, 2),
        (0, 0, "a", F, 3),
        (0, 0, "a", B, 4),
        (0, 1, "a", F, 5),
        (0, 0, "w", G, 6),
        (1, 0, "a", F, 7),
        (1, 0, "a", F, 8),
        (1, 0, "w", G, 9),
        (1, 0, "w", P, 10),
    ]
    suspect = [(*r[:4], r[4] + 100) if r[4] in (3, 8) else r for r in golden]

    def two_segments(records: list) -> list:
        half = len(records) // 2
        return [
            b
            for seg, part in enumerate((records[:half], records[half:]))
            for _, b in bucket_batches(columns(part), seg, 1_000_000)
        ]

    by_row = diff_bucket(0, two_segments(golden), two_segments(suspect), bound=10)
    by_key = diff_bucket(0, two_segments(golden)[::-1], two_segments(suspect)[::-1], bound=10)
    assert by_row.event_diffs.to_pylist() == by_key.event_diffs.to_pylist()
    assert by_row.divergence_steps.to_pylist() == by_key.divergence_steps.to_pylist()
    assert by_row.findings == by_key.findings
    assert rows(by_row, "step", "name", "occurrence", "status") == [
        (0, "in", 0, "equal"),
        (0, "a", 0, "equal"),
        (0, "a", 1, "differ"),
        (0, "a", 0, "equal"),
        (0, "a", 0, "equal"),
        (0, "w", 0, "equal"),
        (1, "a", 0, "equal"),
        (1, "a", 1, "differ"),
        (1, "w", 0, "equal"),
        (1, "w", 0, "equal"),
    ]
