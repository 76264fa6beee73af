"""The transformers.Trainer callback and workload in detail, on real Trainer runs of hf_tiny."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import TrainerCallback, TrainerState

from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile
from tests.integrations import hf_tiny
from tests.support import events
from tracer.checkpoint import list_checkpoints, load_checkpoint
from tracer.fingerprint import fingerprint
from tracer.integrations.hf import SdcTraceCallback
from tracer.log import LogReader, Phase, TensorRecord, rank_dir
from tracer.options import TraceOptions


def test_one_tracer_step_per_optimizer_step_with_losses_as_the_trainer_scales_them(tmp_path: Path) -> None:
    cb = SdcTraceCallback(tmp_path / "run", "golden", options=TraceOptions(sites=hf_tiny.SITES))
    trainer = hf_tiny.make_trainer(tmp_path / "hf", [cb])
    with cb:
        output = trainer.train()
    reader = LogReader(rank_dir(tmp_path / "run", 0))
    records = list(reader.records())
    assert reader.status.end.status == "complete"
    steps = events(tmp_path / "run", "step")
    assert [(e.step, e.fields["microbatches"]) for e in steps] == [(0, 2), (1, 2), (2, 1), (3, 2), (4, 2)]
    # The Trainer's reported loss is the mean over steps of the losses it passed to backward().
    losses = [e.fields["loss"] for e in events(tmp_path / "run", "loss")]
    assert len(losses) == 9 and sum(losses) / 5 == pytest.approx(output.training_loss, rel=1e-6)
    # Gradients and parameters of every parameter at every step; the last parameters are the model's.
    names = [n for n, _ in trainer.model.named_parameters()]
    tensors = [r for r in records if isinstance(r, TensorRecord)]
    for phase in (Phase.GRAD, Phase.PARAM):
        assert sorted((r.step, r.name) for r in tensors if r.phase == phase) == sorted(
            (s, n) for s in range(5) for n in names
        )
    last = {r.name: r.fingerprint for r in tensors if r.phase == Phase.PARAM and r.step == 4}
    assert last == {n: fingerprint(p) for n, p in trainer.model.named_parameters()}
    # Checkpoints at the start and at the Trainer's save steps, each with the LR scheduler's state.
    assert list_checkpoints(tmp_path / "run") == [0, 2, 4, 5]
    assert load_checkpoint(tmp_path / "run", 2).states["scheduler"]["last_epoch"] == 2
    h = reader.header
    assert h.config["run"] == {"steps": 5, "checkpoint_every": 2} and h.seed == hf_tiny.SEED
    assert h.config["training"]["gradient_accumulation_steps"] == 2 and h.config["model"]["hidden_size"] == 32
    assert h.extra["integration"]["library"] == "transformers"
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in trainer.model.modules())


def test_a_model_without_loss_kwargs_logs_losses_divided_by_the_steps_microbatches(tmp_path: Path) -> None:
    """Without num_items_in_batch the Trainer divides by the step's microbatches: 1 at an epoch's short last step."""
    variant = {"variant": {"loss_kwargs": False}}
    cb = SdcTraceCallback(tmp_path / "run", "golden", options=TraceOptions(sites=hf_tiny.SITES), config=variant)
    trainer = hf_tiny.make_trainer(tmp_path / "hf", [cb], loss_kwargs=False)
    with cb:
        output = trainer.train()
    losses = [e.fields["loss"] for e in events(tmp_path / "run", "loss")]
    assert sum(losses) / 5 == pytest.approx(output.training_loss, rel=1e-6)
    assert LogReader(rank_dir(tmp_path / "run", 0)).header.config["variant"] == {"loss_kwargs": False}
    # The workload scales the same way, bit for bit: replay verifies every fingerprint of steps 0 to 3.
    request = ReplayRequest(
        tmp_path / "run",
        tmp_path / "replay",
        parse_steps("1:4"),
        suspect_from_profile("healthy-node"),
        mode="lockstep",
        workload=hf_tiny.WORKLOAD,
        progress=False,
    )
    Replayer(request).run()
    assert all(e.fields["mismatched"] == 0 for e in events(tmp_path / "replay", "site_mismatch"))


class Boom(TrainerCallback):
    def on_step_end(self, args: object, state: TrainerState, control: object, **kwargs: object) -> None:
        if state.global_step == 2:
            raise RuntimeError("boom")


def test_an_exception_in_training_closes_the_log_as_failed(tmp_path: Path) -> None:
    cb = SdcTraceCallback(tmp_path / "run", "golden", options=TraceOptions(sites=hf_tiny.SITES))
    trainer = hf_tiny.make_trainer(tmp_path / "hf", [cb, Boom()])
    with pytest.raises(RuntimeError, match="boom"), cb:
        trainer.train()
    reader = LogReader(rank_dir(tmp_path / "run", 0))
    list(reader.records())
    assert reader.status.end.status == "failed" and "boom" in reader.status.end.detail
    assert [e.step for e in events(tmp_path / "run", "step")] == [0, 1]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in trainer.model.modules())
    assert cb.run.tracer is None
