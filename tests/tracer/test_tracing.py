"""The Tracer on the reference workload and on a model it has never seen."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

from tracer.compare import compare_runs
from tracer.errors import CaptureError, ConfigError
from tracer.fingerprint import fingerprint
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, Phase, TensorRecord
from tracer.options import CapturePolicy, RunInfo, TraceOptions
from tracer.sites import find_sites
from tracer.tracing import Tracer
from workload.model import Transformer


def tensor_records(run: Path) -> list[TensorRecord]:
    return [r for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, TensorRecord)]


def test_same_config_and_seed_record_identical_runs(run_factory) -> None:
    a, b = run_factory("a"), run_factory("b")
    result = compare_runs(a, b)
    assert result.first is None
    assert result.events == len(tensor_records(a)) and result.steps == 4


def test_another_seed_differs_from_step_0(run_factory) -> None:
    a, c = run_factory("a"), run_factory("c", "train.seed=1")
    first = compare_runs(a, c).first
    assert first is not None
    # The batch does not depend on the init seed; the first site's output does.
    assert (first.step, first.microbatch, first.phase, first.name) == (0, 0, Phase.FORWARD, "layers.0.attention")


def test_every_step_records_what_the_issue_lists(run_factory, small_cfg) -> None:
    run = run_factory("golden")
    reader = LogReader(rank_dir(run, 0))
    records = list(reader.records())
    assert reader.status.complete and reader.status.end.status == "complete"
    tensors = [r for r in records if isinstance(r, TensorRecord)]
    events = [r for r in records if isinstance(r, EventRecord)]
    steps, mbs = small_cfg.run.steps, small_cfg.data.microbatches
    n_params = sum(1 for _ in Transformer(small_cfg.model).parameters())
    sites = 2 * small_cfg.model.n_layers
    by_phase = Counter(r.phase for r in tensors)
    assert by_phase == {
        Phase.INPUT: steps * mbs,
        Phase.FORWARD: steps * mbs * sites,
        Phase.BACKWARD: steps * mbs * sites,
        Phase.GRAD: steps * n_params,
        Phase.PARAM: steps * n_params,
    }
    kinds = Counter(e.kind for e in events)
    assert kinds["step"] == steps and kinds["loss"] == steps * mbs
    assert kinds["checkpoint"] == 3  # steps 0, 2 and the final state at 4
    step0 = next(e for e in events if e.kind == "step" and e.step == 0)
    losses = [e.fields["loss"] for e in events if e.kind == "loss" and e.step == 0]
    assert step0.fields["loss"] == pytest.approx(sum(losses))
    assert step0.fields["lr"] == [small_cfg.optim.lr_at(0)] and step0.fields["wall_s"] > 0
    # Backward visits sites in reverse; forward in model order.
    fwd = [r.name for r in tensors if r.step == 0 and r.microbatch == 0 and r.phase == Phase.FORWARD]
    bwd = [r.name for r in tensors if r.step == 0 and r.microbatch == 0 and r.phase == Phase.BACKWARD]
    assert fwd == ["layers.0.attention", "layers.0.feed_forward", "layers.1.attention", "layers.1.feed_forward"]
    assert bwd == fwd[::-1]
    assert all(r.meta == "float32[2,32,128]" for r in tensors if r.phase == Phase.FORWARD)
    # A gradient carries the microbatch whose backward last changed it; a parameter belongs to the step.
    assert {r.microbatch for r in tensors if r.phase == Phase.GRAD} == {mbs - 1} and mbs > 1
    assert {r.microbatch for r in tensors if r.phase == Phase.PARAM} == {0}


def test_gradients_reduced_after_the_microbatches_carry_none(tmp_path: Path) -> None:
    """A gradient all-reduce at the step's end (as a data-parallel workload's) leaves gradients that no
    microbatch's backward was the last to change; a step without one labels them with its last microbatch."""
    from tracer.collectives import observe
    from tracer.log import NO_MICROBATCH

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(model, optimizer, out=tmp_path / "r", run=RunInfo("n"), options=TraceOptions(sites=r"\d")) as tr:
        for step in range(2):
            with tr.step(step):
                for mb in range(3):
                    tr.microbatch(mb)
                    model(torch.ones(2, 4)).sum().backward()
                if step == 1:
                    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                    observe("grads", "all_reduce", Phase.GRAD, "out", grads)
                optimizer.step()
                optimizer.zero_grad()
    grads = {(r.step, r.name): r.microbatch for r in tensor_records(tmp_path / "r") if r.phase == Phase.GRAD}
    assert {mb for (step, _), mb in grads.items() if step == 0} == {2}
    assert {mb for (step, _), mb in grads.items() if step == 1} == {NO_MICROBATCH}
    assert grads[(1, "grads.all_reduce.out")] == NO_MICROBATCH


def test_header_carries_pairing_and_determinism_fields(run_factory, small_cfg) -> None:
    from tracer.config_fingerprint import config_fingerprint

    h = LogReader(rank_dir(run_factory("golden"), 0)).header
    assert h.node_label == "golden" and h.role == "train" and (h.world_size, h.rank) == (1, 0)
    assert h.config == small_cfg.to_dict() and h.config_fingerprint == config_fingerprint(small_cfg.to_dict())
    assert h.fingerprint_algorithm == "lanes64-v1" and h.seed == small_cfg.train.seed
    assert h.determinism["intra_op_threads"] == small_cfg.train.threads
    assert h.determinism["deterministic_algorithms"] is True
    assert {"python", "torch"} <= set(h.versions) and h.device == "cpu" and len(h.data_order_fingerprint) == 64


class Mixer(nn.Module):
    """A user model with its own vocabulary of module names."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "token_mix": nn.Linear(16, 16),
                    "channel_mix": nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)),
                }
            )
            for _ in range(2)
        )
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b["token_mix"](x)
            x = x + b["channel_mix"](x)
        return self.head(x)


MIXER_SITES = r"blocks\.\d+\.(token_mix|channel_mix)"
MIXER = TraceOptions(sites=MIXER_SITES)


def train_mixer(out: Path, sites, steps: int = 3) -> Mixer:
    torch.manual_seed(0)
    model = Mixer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Tracer(model, opt, out=out, run=RunInfo("user", config={"lr": 0.1}), options=TraceOptions(sites=sites)) as tr:
        for step in range(steps):
            with tr.step(step):
                x = torch.randn(5, 16, generator=torch.Generator().manual_seed(step))
                tr.microbatch(0, inputs=x)
                loss = model(x).pow(2).mean()
                loss.backward()
                tr.loss(loss)
                opt.step()
                opt.zero_grad()
    return model


def test_traces_a_user_model_with_other_names_and_sgd(tmp_path: Path) -> None:
    model = train_mixer(tmp_path / "run", sites=MIXER_SITES)
    recs = tensor_records(tmp_path / "run")
    fwd = {r.name for r in recs if r.phase == Phase.FORWARD}
    assert fwd == {f"blocks.{i}.{k}" for i in range(2) for k in ("token_mix", "channel_mix")}
    assert {r.name for r in recs if r.phase == Phase.PARAM} == {n for n, _ in model.named_parameters()}
    assert Counter(r.phase for r in recs)[Phase.GRAD] == 3 * len(list(model.parameters()))
    # Every hook is gone after the with-block.
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
    # The final parameters in the log are the model's final parameters, bit for bit.

    last = {r.name: r.fingerprint for r in recs if r.phase == Phase.PARAM and r.step == 2}
    assert last == {n: fingerprint(p) for n, p in model.named_parameters()}


def test_sites_by_list_of_modules_and_by_class_name(tmp_path: Path) -> None:
    model = Mixer()
    chosen = [model.blocks[1]["channel_mix"]]
    assert find_sites(model, chosen) == [("blocks.1.channel_mix", chosen[0])]

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = Attention()
            self.b = nn.Linear(4, 4)

    net = Net()
    assert [n for n, _ in find_sites(net)] == ["a"]
    with pytest.raises(ConfigError, match="matches no module path"):
        find_sites(net, r"nothing\.here")
    with pytest.raises(ConfigError, match="not a submodule"):
        find_sites(net, [nn.Linear(1, 1)])


def test_a_model_without_default_sites_is_a_clear_error_that_shows_its_modules(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    with pytest.raises(ConfigError) as err:
        Tracer(model, None, out=tmp_path / "run", run=RunInfo("x"))
    message = str(err.value)
    assert "found no default sites in Sequential" in message and "activations=False" in message
    assert 'sites=r"0|2"' in message
    assert message.endswith("modules:\nSequential\n  0 Linear\n  1 GELU\n  2 Linear")
    assert not (tmp_path / "run").exists()
    # Either way out works.
    Tracer(model, None, out=tmp_path / "a", run=RunInfo("x"), options=TraceOptions(sites=r"0|2"))
    Tracer(model, None, out=tmp_path / "b", run=RunInfo("x"), options=TraceOptions(activations=False))


@pytest.mark.slow
def test_a_compiled_model_records_the_names_of_the_eager_one(tmp_path: Path) -> None:
    from tests.tracer.test_user_models import lm_loss, train
    from tests.tracer.user_models import tiny_gpt
    from tracer.pairing import pairing_differences

    eager = train(tiny_gpt(), lm_loss, tmp_path / "eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = train(torch.compile(tiny_gpt(), backend="eager"), lm_loss, tmp_path / "compiled")
    # The hooks run as they are between compiled regions: Dynamo does not trace into them and warn about the kernel.
    assert not [w for w in caught if "sdctrace" in str(w.message)], [str(w.message)[:200] for w in caught]
    ha, hb = LogReader(rank_dir(eager, 0)).header, LogReader(rank_dir(compiled, 0)).header
    assert hb.extra["sites"] == ["h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp"]
    assert pairing_differences(ha, hb) == []
    names = [[(r.name, r.phase) for r in tensor_records(run)] for run in (eager, compiled)]
    assert names[0] == names[1] and not any("_orig_mod" in n for n, _ in names[1])


def test_a_training_error_closes_the_log_as_failed(tmp_path: Path) -> None:
    model = Mixer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        with Tracer(model, opt, out=tmp_path / "run", run=RunInfo("x"), options=MIXER) as tr:
            with tr.step(0):
                model(torch.randn(2, 16)).sum().backward()
                raise RuntimeError("boom")
    reader = LogReader(rank_dir(tmp_path / "run", 0))
    list(reader.records())
    assert reader.status.complete and reader.status.end.status == "failed"
    assert "boom" in reader.status.end.detail
    assert not any(m._forward_hooks for m in model.modules())


def test_a_step_with_a_closure_records_the_gradients_the_closure_leaves(tmp_path: Path) -> None:
    """Lightning and LBFGS compute (and Lightning clips) the gradients inside ``optimizer.step(closure)``."""
    torch.manual_seed(0)
    model = Mixer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 16)
    seen: dict[str, torch.Tensor] = {}

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        seen.update({n: p.grad.clone() for n, p in model.named_parameters()})
        return loss

    with Tracer(
        model, opt, out=tmp_path / "run", run=RunInfo("x"), options=TraceOptions(sites=r"blocks\.\d+\.token_mix")
    ) as tr:
        with tr.step(0):
            opt.step(closure)
        with tr.step(1):
            opt.step(closure=closure)
    grads = [r for r in tensor_records(tmp_path / "run") if r.phase == Phase.GRAD]
    assert {r.step for r in grads} == {0, 1}
    assert {r.name: r.fingerprint for r in grads if r.step == 1} == {n: fingerprint(g) for n, g in seen.items()}


def test_a_failing_disk_surfaces_in_the_training_thread(tmp_path: Path) -> None:
    model = Mixer()
    with pytest.raises(CaptureError, match="I/O thread"):
        with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER) as tr:
            tr.sync()  # the log file opens at the first flush
            # Pull the real file out from under the I/O thread, as a vanished disk would.
            tr.log.writer._file._box["f"].close()
            for step in range(50):
                with tr.step(step):
                    model(torch.randn(2, 16))
                tr.sync()


def test_capture_policy_stores_full_tensors_by_fingerprint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Mixer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = CapturePolicy(steps=frozenset({1}), names=r"blocks\.0\..*")
    seen: dict[str, torch.Tensor] = {}
    model.blocks[0]["token_mix"].register_forward_hook(lambda m, a, o: seen.__setitem__("out", o.detach().clone()))
    sites = r"blocks\.\d\.token_mix"
    with Tracer(model, opt, out=tmp_path / "run", run=RunInfo("x"), options=TraceOptions(sites, capture=policy)) as tr:
        for step in range(2):
            with tr.step(step):
                model(torch.randn(3, 16)).sum().backward()
                opt.step()
                opt.zero_grad()
    records = list(LogReader(rank_dir(tmp_path / "run", 0)).records())
    blobs = [r for r in records if isinstance(r, EventRecord) and r.kind == "blob"]
    assert blobs and all(b.step == 1 and b.fields["name"].startswith("blocks.0.") for b in blobs)
    fwd = next(
        r
        for r in records
        if isinstance(r, TensorRecord) and r.step == 1 and r.name == "blocks.0.token_mix" and r.phase == Phase.FORWARD
    )
    assert any(b.fields["fingerprint"] == fwd.fingerprint for b in blobs)
    assert torch.equal(tr.blobs.get(fwd.fingerprint), seen["out"])


def test_tracer_outside_with_block_is_a_clear_error(tmp_path: Path) -> None:
    tr = Tracer(Mixer(), None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER)
    with pytest.raises(CaptureError, match="not active"):
        tr.event("note")


def test_runs_traced_at_other_sites_do_not_pair(run_factory) -> None:
    from tracer.pairing import pairing_differences

    a = LogReader(rank_dir(run_factory("a", "run.steps=1"), 0)).header
    attention_only = TraceOptions(sites=r"layers\.\d+\.attention")
    b = LogReader(rank_dir(run_factory("b", "run.steps=1", trace=attention_only), 0)).header
    assert a.extra["sites"] == [
        "layers.0.attention",
        "layers.0.feed_forward",
        "layers.1.attention",
        "layers.1.feed_forward",
    ]
    assert pairing_differences(a, a) == []
    fix = "(trace both at the same sites: TraceOptions(sites=...) in Python, --sites with sdc record)"
    assert pairing_differences(a, b) == [
        f"extra.sites: 4 traced sites vs 2, only in the first: layers.0.feed_forward, layers.1.feed_forward {fix}"
    ]
    many = dataclasses.replace(b, extra={**b.extra, "sites": [*b.extra["sites"], *(f"extra.{i}" for i in range(5))]})
    assert pairing_differences(a, many) == [
        "extra.sites: 4 traced sites vs 7, only in the first: layers.0.feed_forward, layers.1.feed_forward; "
        f"only in the second: extra.0, extra.1, extra.2 and 2 more {fix}"
    ]
    swapped = dataclasses.replace(a, extra={**a.extra, "sites": a.extra["sites"][::-1]})
    assert pairing_differences(a, swapped) == [f"extra.sites: 4 traced sites vs 4, the same in another order {fix}"]
