"""The transformers.Trainer callback and workload in detail, on real Trainer runs of hf_tiny."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from transformers import TrainerCallback, TrainerState

from faults import load_profile
from faults.node import node_options
from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile
from tests.integrations import hf_tiny
from tests.support import events
from tracer.checkpoint import list_checkpoints, load_checkpoint
from tracer.errors import TraceWarning
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


def test_the_emulated_node_knows_the_sites_the_callbacks_tracer_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``TraceOptions(sites=R)`` and ``**node_options(profile)``, a fault in a site R adds to the defaults is
    in a traced site: nothing is warned of, R is matched once, and lockstep replay of the golden run under the
    profile (which takes the log's site names, no pattern) charges that site alone."""
    sites = r"model\.layers\.\d+\.(self_attn|mlp)|lm_head"
    profile = tmp_path / "head.toml"
    profile.write_text(
        f'[[fault]]\nops = ["matmul"]\nsites = "lm_head"\nphases = ["forward"]\nsteps = [{hf_tiny.FAULT_STEP}]\n'
        'elements = 4\nkind = "scale"\nfactor = 8.0\n',
        encoding="utf-8",
    )
    compiled: list[str] = []
    compile_ = re.compile

    def counting(pattern, *args, **kwargs):  # noqa: ANN001, ANN202
        compiled.extend([pattern] if pattern == sites else [])
        return compile_(pattern, *args, **kwargs)

    golden = SdcTraceCallback(tmp_path / "golden", "golden", options=TraceOptions(sites=sites))
    with golden:
        hf_tiny.make_trainer(tmp_path / "golden-hf", [golden]).train()
    monkeypatch.setattr(re, "compile", counting)
    cb = SdcTraceCallback(
        tmp_path / "run", "sick", options=TraceOptions(sites=sites), **node_options(load_profile(profile))
    )
    trainer = hf_tiny.make_trainer(tmp_path / "hf", [cb])
    with warnings.catch_warnings(), cb:
        warnings.simplefilter("error", TraceWarning)  # "a fault hit ... which no traced site holds" was spurious
        trainer.train()
    assert compiled == [sites]
    assert {(e.step, e.fields["site"]) for e in events(tmp_path / "run", "fault")} == {(hf_tiny.FAULT_STEP, "lm_head")}
    step = hf_tiny.FAULT_STEP
    request = ReplayRequest(
        tmp_path / "golden",
        tmp_path / "replay",
        parse_steps(f"{step}:{step + 1}"),
        suspect_from_profile(str(profile)),
        mode="lockstep",
        workload=hf_tiny.WORKLOAD,
        progress=False,
    )
    Replayer(request).run()
    charged = {
        (e.fields["site"], e.fields["phase"])
        for e in events(tmp_path / "replay", "site_mismatch")
        if e.fields["mismatched"]
    }
    assert charged == {("lm_head", "forward")}
