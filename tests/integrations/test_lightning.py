"""The Lightning callback and workload in detail, on real fits of lightning_tiny."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile
from tests.integrations import lightning_tiny
from tests.support import events
from tracer.checkpoint import list_checkpoints, load_checkpoint
from tracer.fingerprint import fingerprint
from tracer.integrations.lightning import SdcTraceCallback
from tracer.log import LogReader, Phase, TensorRecord, rank_dir
from tracer.options import TraceOptions


def test_one_tracer_step_per_optimizer_step_with_the_losses_backward_got(tmp_path: Path) -> None:
    cb = SdcTraceCallback(
        tmp_path / "run",
        "golden",
        seed=lightning_tiny.SEED,
        options=TraceOptions(sites=lightning_tiny.SITES),
        checkpoint_every=2,
    )
    module, trainer = lightning_tiny.make(tmp_path / "pl", [cb])
    trainer.fit(module)
    reader = LogReader(rank_dir(tmp_path / "run", 0))
    records = list(reader.records())
    assert reader.status.end.status == "complete"
    assert [(e.step, e.fields["microbatches"]) for e in events(tmp_path / "run", "step")] == [
        (0, 2),
        (1, 2),
        (2, 1),
        (3, 2),
        (4, 2),
    ]
    # The loss backward() got is training_step's divided by accumulate_grad_batches, a short step's too.
    losses = events(tmp_path / "run", "loss")
    assert len(losses) == 9
    assert 2 * losses[-1].fields["loss"] == pytest.approx(float(trainer.callback_metrics["train_loss"]), rel=1e-6)
    # Gradients after Lightning's clipping (inside the optimizer's closure): a larger total norm is clipped to CLIP.
    tensors = [r for r in records if isinstance(r, TensorRecord)]
    norms = [math.sqrt(sum(r.l2**2 for r in tensors if r.phase == Phase.GRAD and r.step == s)) for s in range(5)]
    clip = lightning_tiny.CLIP
    assert all(n <= clip * (1 + 1e-5) for n in norms) and any(n == pytest.approx(clip, rel=1e-5) for n in norms), norms
    last = {r.name: r.fingerprint for r in tensors if r.phase == Phase.PARAM and r.step == 4}
    assert last == {n: fingerprint(p) for n, p in module.named_parameters()}
    # Checkpoints every 2 steps and at the end, with the scheduler (StepLR) state.
    assert list_checkpoints(tmp_path / "run") == [0, 2, 4, 5]
    assert load_checkpoint(tmp_path / "run", 4).states["scheduler"]["last_epoch"] == 4
    h = reader.header
    assert h.config["run"] == {"steps": 5, "checkpoint_every": 2} and h.seed == lightning_tiny.SEED
    assert h.config["trainer"]["accumulate_grad_batches"] == 2 and h.config["module"]["hparams"]["dim"] == 32
    assert h.extra["integration"]["library"] == "pytorch_lightning"
    assert not any(m._forward_hooks or m._backward_hooks for m in module.modules())


def test_an_exception_in_fit_closes_the_log_as_failed(tmp_path: Path) -> None:
    class Boom(lightning_tiny.pl.Callback):
        def on_train_batch_end(self, trainer: lightning_tiny.pl.Trainer, *args: object) -> None:
            if trainer.global_step == 2:
                raise RuntimeError("boom")

    cb = SdcTraceCallback(tmp_path / "run", "golden", seed=0, options=TraceOptions(sites=lightning_tiny.SITES))
    module, trainer = lightning_tiny.make(tmp_path / "pl", [cb, Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(module)
    reader = LogReader(rank_dir(tmp_path / "run", 0))
    list(reader.records())
    assert reader.status.end.status == "failed" and "boom" in reader.status.end.detail
    assert [e.step for e in events(tmp_path / "run", "step")] == [0, 1]
    assert cb.run.tracer is None and not any(m._forward_hooks for m in module.modules())


@pytest.mark.slow
def test_a_bf16_mixed_run_with_dropout_replays_from_every_checkpoint(tmp_path: Path) -> None:
    """Lightning's precision plugin runs the replayed forward under the recording's autocast, and the dropout
    masks are the recording's: every fingerprint of steps 0 to 4 is verified."""
    run = lightning_tiny.record(tmp_path / "run", "golden", config={"variant": {"bf16": True, "dropout": 0.1}})
    metas = {
        r.meta
        for r in LogReader(rank_dir(run, 0)).records()
        if isinstance(r, TensorRecord) and r.phase == Phase.FORWARD
    }
    assert metas == {"bfloat16[2,16,32]"}
    for steps in ("0:2", "2:4", "4:5"):
        request = ReplayRequest(
            run,
            tmp_path / f"replay-{steps.replace(':', '-')}",
            parse_steps(steps),
            suspect_from_profile("healthy-node"),
            mode="lockstep",
            workload=lightning_tiny.WORKLOAD,
            progress=False,
        )
        Replayer(request).run()
        sites = events(request.out, "site_mismatch")
        assert sites and all(e.fields["mismatched"] == 0 for e in sites)
