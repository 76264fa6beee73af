"""The detector alarms' inputs and scoring: the digest bytes built with numpy against `step_fingerprint` fed
record by record, and the alarm rows of every detector set against each set run alone by a guard."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest

from pipelines.alarms import COMBINATION, DETECTORS, StepFacts, run_alarms, step_facts
from pipelines.segment_evidence import CHUNK_BYTES, SegmentEvidence, grad_groups
from tests.pipelines.test_transforms import columns
from tracer.guard import AbftFlags, Evidence, Guard, History, TwinMismatch, default_guard, step_fingerprint
from tracer.log import Phase


def test_grad_digest_bytes_hash_as_step_fingerprint_does() -> None:
    rng = random.Random(3)
    names = ["w", "layers.0.attention.wq.weight", "ünïcode.gewicht", "a" * 300, "x\0y"]
    records = [
        (step, 0, rng.choice(names), rng.choice([Phase.GRAD, Phase.GRAD, Phase.PARAM]), rng.getrandbits(64))
        for step in (0, 0, 1, 3, 3, 3, 3, 7)
        for _ in range(rng.randint(1, 30))
    ]
    cols = columns(records)
    cols.l2[:] = np.array([rng.uniform(0, 10) for _ in records], np.float32)
    cols.nan[:] = [rng.randint(0, 2) for _ in records]
    g = grad_groups(cols)
    groups = list(zip(g.steps.tolist(), g.digest_inputs(), g.squares.tolist(), g.nonfinite.tolist()))
    grads = [r for r in records if r[3] == Phase.GRAD]
    expected = []
    for r in grads:  # runs of equal steps, in log order
        if not expected or expected[-1][0] != r[0]:
            expected.append((r[0], []))
        expected[-1][1].append(r)
    assert [group[0] for group in groups] == [step for step, _ in expected]
    for (_, digest_input, squares, nonfinite), (step, rs) in zip(groups, expected):
        assert int.from_bytes(hashlib.blake2b(digest_input, digest_size=8).digest(), "little") == step_fingerprint(
            (name, fp) for _, _, name, _, fp in rs
        )
        at = [i for i, r in enumerate(records) if r[3] == Phase.GRAD and r[0] == step]
        assert squares == sum(float(cols.l2[i]) ** 2 for i in at)
        assert nonfinite == sum(int(cols.nan[i]) for i in at)


@pytest.mark.slow  # megabytes of records checked against a reference in Python: a few seconds
def test_grad_digest_bytes_span_chunks_and_skip_padding_that_would_cost_too_much() -> None:
    width = 1000
    n = 3 * CHUNK_BYTES // width
    many = [f"n{i}" for i in range(CHUNK_BYTES // width + 1)]  # with one long name: too much padding
    for long_names, short_names in (([f"p{i}" + "x" * (width - 20) for i in range(5)], []), (["y" * width], many)):
        names = long_names + short_names
        records = [(i // 7, 0, names[i % len(names)], Phase.GRAD, i) for i in range(n)]
        g = grad_groups(columns(records))
        assert len(g.steps) == records[-1][0] + 1
        for step, digest_input in list(zip(g.steps.tolist(), g.digest_inputs()))[::500]:
            rs = [r for r in records if r[0] == step]
            assert hashlib.blake2b(digest_input, digest_size=8).digest() == step_fingerprint(
                (r[2], r[4]) for r in rs
            ).to_bytes(8, "little")


def naive(facts: list[StepFacts], detectors: tuple, name: str | None = None) -> list[dict]:
    """Each set of detectors on its own, as the guard runs them: detector_alarms rows."""
    guard, past, rows = Guard(detectors=detectors), History(), []

    def row(f: StepFacts, detector: str, measured: float | None, threshold: float | None, detail: str | None) -> dict:
        return {
            "rank": 3,
            "run_id": "r",
            "node_label": "n",
            "step": f.step,
            "detector": detector,
            "fired": measured is not None,
            "measured": measured,
            "threshold": threshold,
            "detail": detail,
            "faults": f.faults,
            "guarded": f.guarded,
            "loss": f.loss,
            "wall_s": f.wall_s,
        }

    for f in facts:
        e = Evidence(f.step, 0, f.loss, f.grad_norm, f.nonfinite, f.abft_flags, f.fingerprint, None, past)
        alarms = {a.detector: a for a in guard.check(e)}
        if not alarms:
            past = past.after(e, guard.keep)
        if name is not None:
            rows.append(
                row(f, name, float(len(alarms)), 1.0, ",".join(alarms)) if alarms else row(f, name, None, None, None)
            )
            continue
        for d in detectors:
            a = alarms.get(d.name)
            rows.append(row(f, d.name, a.measured, a.threshold, a.detail) if a else row(f, d.name, None, None, None))
    return rows


def test_alarm_rows_equal_each_set_run_alone() -> None:
    """Spikes that one set flags and another accepts make their histories part; rows must not tell. From step 200
    to 300 the gradient norm is 20 times higher, and from step 200 on the loss is half: the guard's combination
    flags steps 200 to 299, so its loss history stays at step 199 while LossSpike's alone follows the lower loss;
    a bump at step 280 is a spike only to the latter."""
    rng = random.Random(5)
    facts = []
    for step in range(400):
        loss = (3.0 if step < 200 else 1.5) + rng.gauss(0, 0.01)
        norm = (1.0 + rng.gauss(0, 0.05)) * (20 if 200 <= step < 300 else 1)
        if step % 37 == 20 or step == 280:
            loss *= 1.2
        if step % 53 == 30:
            norm *= 20
        if step == 250:
            loss = math.nan
        facts.append(
            StepFacts(
                step,
                loss,
                norm,
                int(step == 111),
                int(step % 61 == 5),
                rng.getrandbits(64),
                int(step % 37 == 20),
                wall_s=0.1,
            )
        )
    twin = {f.step: f.fingerprint if f.step % 41 else f.fingerprint ^ 1 for f in facts}

    class Twin:
        def fingerprint(self, step: int) -> int | None:
            return twin.get(step)

    for abft in (False, True):
        expected = [row for d in DETECTORS if abft or not isinstance(d, AbftFlags) for row in naive(facts, (d,))]
        expected += naive(facts, (TwinMismatch(Twin()),))
        expected += naive(facts, default_guard(abft=abft).detectors, COMBINATION)
        got = run_alarms(facts, abft, twin, 3, "r", "n").to_pylist()
        at_280 = {r["detector"]: r for r in got if r["step"] == 280}
        assert at_280["loss_spike"]["fired"] and at_280[COMBINATION]["detail"] == "grad_norm_spike"
        assert len(got) == len(expected) and [_nan(r) for r in got] == [_nan(r) for r in expected]


def _nan(row: dict) -> dict:
    """NaN, which equals nothing, as a string."""
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def test_step_facts_join_a_step_split_across_segments() -> None:
    records = [(1, 0, "a", Phase.GRAD, 11), (1, 0, "b", Phase.GRAD, 12), (2, 0, "a", Phase.GRAD, 21)]
    cols_1, cols_2 = columns(records[:1]), columns(records[1:])
    segs = [
        SegmentEvidence("suspect", 0, grad_groups(cols_1), ((1, "fault", {}),)),
        SegmentEvidence(
            "suspect",
            1,
            grad_groups(cols_2),
            ((1, "step", {"loss": 2.0}), (2, "abft", {"verdict": "flag"}), (2, "step", {"loss": 1.0})),
        ),
    ]
    facts, abft, guards = step_facts(segs)
    assert abft and not guards
    assert [(f.step, f.faults, f.abft_flags, f.loss) for f in facts] == [(1, 1, 0, 2.0), (2, 0, 1, 1.0)]
    assert facts[0].fingerprint == step_fingerprint([("a", 11), ("b", 12)])
    assert facts[0].grad_norm == math.sqrt(2.0)
