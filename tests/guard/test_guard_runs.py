"""The guard inside real training: the small reference workload, the real fault emulator, real logs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from faults import load_profile
from tests.guard.support import kinds, params, record_guarded, records, stuck_logit, trained
from tracer.checkpoint import load_checkpoint
from tracer.errors import GuardStop
from tracer.fingerprint import fingerprint
from tracer.guard import GradNormSpike, Guard, LossSpike, NonFinite, RecordedTwin, TwinMismatch, UpdateRmsSpike
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

FAULT_STEP = 4
SPIKE = LossSpike(window=4, min_history=2)  # steps 0-3 are its history at the fault step


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("guard") / "healthy"
    record_guarded(out, None, steps=FAULT_STEP + 2)
    return out


def test_a_guarded_healthy_run_is_bit_identical_to_an_unguarded_one(healthy: Path, tmp_path: Path) -> None:
    guard = Guard(
        detectors=(NonFinite(), SPIKE, GradNormSpike(window=4, min_history=2), UpdateRmsSpike(window=4, min_history=2))
    )
    record_guarded(tmp_path / "guarded", guard, steps=FAULT_STEP + 2)
    assert trained(tmp_path / "guarded") == trained(healthy)
    assert kinds(tmp_path / "guarded", "guard") == []
    header = LogReader(rank_dir(tmp_path / "guarded", 0)).header
    assert [d["name"] for d in header.extra["guard"]["detectors"]] == [
        "non_finite",
        "loss_spike",
        "grad_norm_spike",
        "update_rms_spike",
    ]
    assert header.extra["guard"]["detectors"][1] == {
        "name": "loss_spike",
        "window": 4,
        "z": SPIKE.z,
        "floor": SPIKE.floor,
        "min_history": 2,
    }


def test_a_transient_fault_is_caught_recomputed_and_training_goes_on_as_if_healthy(
    healthy: Path, tmp_path: Path
) -> None:
    profile = stuck_logit(tmp_path, FAULT_STEP, persistent=False, attempts=[0])  # the first run only
    out = tmp_path / "guarded"
    losses = record_guarded(
        out, Guard(detectors=(NonFinite(), SPIKE), on_deterministic="stop"), FAULT_STEP + 2, profile
    )
    (event,) = kinds(out, "guard")
    assert event.step == FAULT_STEP
    f = event.fields
    assert set(f) == {"alarms", "outcome", "action", "accepted", "runs"}
    (alarm,) = f["alarms"]
    assert alarm["detector"] == "loss_spike" and alarm["measured"] > alarm["threshold"] == SPIKE.z
    assert "loss" in alarm["detail"]
    assert (f["outcome"], f["action"], f["accepted"]) == ("transient", "continue", 2)
    first, rerun, confirmed = f["runs"]
    assert [r["attempt"] for r in f["runs"]] == [0, 1, 2]
    assert first["fingerprint"] != rerun["fingerprint"] == confirmed["fingerprint"]
    # The ground truth of each run: the emulator's fault events, counted per run.
    assert (first["events"], rerun["events"], confirmed["events"]) == ({"fault": 1}, {}, {})
    assert first["loss"] > rerun["loss"] + 10
    # The log holds the run training used: every fingerprint and loss is the healthy run's, the fault step's too,
    # and no fault event remains (the faulty run was discarded).
    assert trained(out) == trained(healthy)
    assert kinds(out, "fault") == []
    assert losses[FAULT_STEP] == pytest.approx(rerun["loss"])


@pytest.mark.parametrize("policy", ["continue", "skip", "stop"])
def test_a_fault_that_reproduces_is_deterministic_and_the_policy_decides(
    healthy: Path, tmp_path: Path, policy: str
) -> None:
    profile = stuck_logit(tmp_path, FAULT_STEP, persistent=True)
    out = tmp_path / policy
    guard = Guard(detectors=(NonFinite(), SPIKE), on_deterministic=policy, max_runs=5)
    if policy == "stop":
        with pytest.raises(
            GuardStop, match=f"step {FAULT_STEP}: the guard stopped training \\(deterministic: loss_spike"
        ) as stopped:
            record_guarded(out, guard, FAULT_STEP + 2, profile)
        assert stopped.value.step == FAULT_STEP and stopped.value.checkpoint is not None
    else:
        record_guarded(out, guard, FAULT_STEP + 2, profile)
    (event,) = kinds(out, "guard")
    f = event.fields
    # One re-run that reproduces the first run bit for bit settles it: no retry loop, whatever max_runs allows.
    assert f["outcome"] == "deterministic" and f["action"] == policy
    assert [r["attempt"] for r in f["runs"]] == [0, 1]
    assert f["runs"][0]["fingerprint"] == f["runs"][1]["fingerprint"]
    assert f["runs"][0]["events"] == f["runs"][1]["events"] == {"fault": 1}
    assert f["accepted"] == (1 if policy == "continue" else None)
    before = params(healthy, FAULT_STEP - 1)
    assert params(out, FAULT_STEP - 1) == before
    if policy == "continue":
        unguarded = tmp_path / "unguarded"
        record_guarded(unguarded, None, FAULT_STEP + 2, profile)
        assert trained(out) == trained(unguarded)
    elif policy == "skip":
        assert params(out, FAULT_STEP) == before  # the optimizer changed nothing
        assert params(out, FAULT_STEP + 1) != params(healthy, FAULT_STEP + 1)
        assert [e.step for e in kinds(out, "step")] == list(range(FAULT_STEP + 2))
    else:
        reader = LogReader(rank_dir(out, 0))
        tail = list(reader.records())[-3:]
        assert reader.status.end is not None and reader.status.end.status == "failed"
        assert "GuardStop" in reader.status.end.detail
        assert [getattr(r, "kind", None) for r in tail] == [None, "guard", "checkpoint"]  # the last gradient first
        assert max(e.step for e in kinds(out, "step")) == FAULT_STEP - 1
        # The checkpoint holds the state the stopped step began from: the parameters after the step before it.
        model = load_checkpoint(out, FAULT_STEP).model
        assert {name: fingerprint(model[name]) for name in before} == before


def test_a_guard_without_a_way_to_rerun_logs_an_unclassified_alarm_and_applies_its_policy(tmp_path: Path) -> None:
    """A loop of one's own that gives no rerun: the detectors still act, once warned about."""
    from tracer.errors import TraceWarning
    from tracer.options import RunInfo, TraceOptions
    from tracer.tracing import Tracer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(detectors=(NonFinite(),), on_deterministic="skip")
    x = torch.randn(8, 4)
    with Tracer(
        model, opt, out=tmp_path / "run", run=RunInfo("own"), options=TraceOptions(activations=False), guard=guard
    ) as tr:
        for step in range(3):
            with tr.step(step):
                y = x.clone()
                if step == 1:
                    y[0, 0] = float("nan")  # a poisoned batch
                loss = model(y).square().mean()
                loss.backward()
                tr.loss(loss)
                before = [p.detach().clone() for p in model.parameters()]
                if step == 1:
                    with pytest.warns(TraceWarning, match="cannot be run again"):
                        opt.step()
                    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
                else:
                    opt.step()
                opt.zero_grad()
    (event,) = kinds(tmp_path / "run", "guard")
    assert event.step == 1 and event.fields["outcome"] == "unclassified" and event.fields["action"] == "skip"
    assert [r["attempt"] for r in event.fields["runs"]] == [0]
    assert event.fields["alarms"][0]["detector"] == "non_finite"
    grads = [r for r in records(tmp_path / "run") if isinstance(r, TensorRecord) and r.phase == Phase.GRAD]
    assert len(grads) == 3 * 4  # every step's gradients, the skipped one's too


def test_a_twin_sees_what_no_statistic_can(healthy: Path, tmp_path: Path) -> None:
    """One mantissa bit of one matmul result at step 2: invisible in the loss, not in the gradients' bits."""
    path = tmp_path / "flip.toml"
    path.write_text(
        '[[fault]]\nops = ["mm"]\nsites = "layers\\\\.1\\\\.feed_forward"\nphases = ["forward"]\n'
        'steps = [2]\nkind = "bitflip"\nbits = "mantissa"\npersistent = true\n',
        encoding="utf-8",
    )
    twin = RecordedTwin(healthy)
    guard = Guard(detectors=(SPIKE, TwinMismatch(twin)), on_deterministic="stop")
    record_guarded(tmp_path / "same", guard, FAULT_STEP + 2)
    assert kinds(tmp_path / "same", "guard") == []
    with pytest.raises(GuardStop, match="step 2: .*twin_mismatch"):
        record_guarded(tmp_path / "flipped", guard, FAULT_STEP + 2, load_profile(path))
    (event,) = kinds(tmp_path / "flipped", "guard")
    assert [a["detector"] for a in event.fields["alarms"]] == ["twin_mismatch"]
    first, rerun = event.fields["runs"]
    # SwiGLU: three matmuls a forward, two microbatches; the same six faults in both runs
    assert event.fields["outcome"] == "deterministic" and first["events"] == rerun["events"] == {"fault": 6}
    assert twin.fingerprint(FAULT_STEP + 2) is None  # the twin never ran that step: abstain


def test_a_guard_that_never_fires_leaves_an_emulated_node_as_it_was(tmp_path: Path) -> None:
    """Held records, saved RNG states and the update RMS change nothing the emulator draws: same faults, same bits."""
    profile = load_profile("bursty-mismatch")
    quiet = Guard(detectors=(NonFinite(), UpdateRmsSpike(factor=1e30, window=2, min_history=1)))
    record_guarded(tmp_path / "plain", None, 4, profile, fault_seed=1)
    record_guarded(tmp_path / "guarded", quiet, 4, profile, fault_seed=1)
    faults = [(e.step, e.fields) for e in kinds(tmp_path / "plain", "fault")]
    assert faults and faults == [(e.step, e.fields) for e in kinds(tmp_path / "guarded", "fault")]
    assert trained(tmp_path / "guarded") == trained(tmp_path / "plain")
