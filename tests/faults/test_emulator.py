"""The fault emulator on real recorded runs: where faults land, reproducibility, no side effects."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from faults import FaultEmulator, load_profile, profile_from_header
from tests.faults.support import events
from tests.support import small_config
from tracer.compare import compare_runs
from tracer.errors import ConfigError
from tracer.intercept import Interceptor
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase
from tracer.options import RunInfo
from tracer.pairing import pairing_differences
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build

# Flip the top exponent bit of float32 (bit 30) in every mm of one site on step 2 only.
EXPONENT_FLIP = """
[[fault]]
ops = ["mm"]
sites = 'layers\\.1\\.{site}'
phases = ["{phase}"]
kind = "bitflip"
bits = 30
steps = [2]
"""


@pytest.mark.parametrize(("site", "phase"), [("feed_forward", "forward"), ("attention", "backward")])
def test_an_exponent_flip_at_one_step_and_op_is_the_first_difference(
    healthy_run, run_factory, write_profile, site: str, phase: str
) -> None:
    faulty = run_factory("faulty", fault_profile=write_profile(EXPONENT_FLIP.format(site=site, phase=phase)))
    first = compare_runs(healthy_run, faulty).first
    assert first is not None and first.golden is not None and first.suspect is not None
    # compare_runs walks both logs in order, so every event before this one is bit-identical.
    assert (first.step, first.microbatch, first.name, first.phase) == (2, 0, f"layers.1.{site}", Phase[phase.upper()])
    faults = events(faulty, "fault")
    assert faults and {f.step for f in faults} == {2}
    for f in faults:
        assert (f.fields["site"], f.fields["op"], f.fields["phase"]) == (f"layers.1.{site}", "aten.mm.default", phase)
        assert f.fields["kind"] == "bitflip" and f.fields["detail"] == {"dtype": "float32", "bits": [30]}
        assert f.fields["elements"] == 1 and f.fields["original"] != f.fields["corrupted"]


@pytest.mark.slow
def test_the_same_profile_and_seed_reproduce_faults_and_fingerprints(healthy_run, run_factory) -> None:
    profile = load_profile("bursty-mismatch")
    a = run_factory("a", fault_profile=profile, fault_seed=5)
    b = run_factory("b", fault_profile=profile, fault_seed=5)
    other = run_factory("other", fault_profile=profile, fault_seed=6)
    faults_a = [(f.step, f.fields) for f in events(a, "fault")]
    assert len(faults_a) > 10 and faults_a == [(f.step, f.fields) for f in events(b, "fault")]
    assert compare_runs(a, b).first is None
    assert faults_a != [(f.step, f.fields) for f in events(other, "fault")]
    assert compare_runs(a, healthy_run).first is not None


@pytest.mark.slow
def test_an_emulator_that_never_fires_changes_nothing(run_factory, write_profile) -> None:
    """Hooks on extra sites and every per-call draw leave training bit for bit as it was."""
    healthy = run_factory("healthy")
    rng_after_healthy = torch.random.get_rng_state(), random.getstate()
    never = write_profile(
        '[[fault]]\nops = ["matmul", "elementwise", "reduction", "softmax"]\n'
        'sites = "(.*_)?norm|.*w2|layers.0"\np_call = 0.0\nkind = "bitflip"\n'
    )
    for name, profile in [("healthy-node", load_profile("healthy-node")), ("never", never)]:
        run = run_factory(name, fault_profile=profile, fault_seed=3)
        assert compare_runs(healthy, run).first is None, name
        assert events(run, "fault") == []
        # No global RNG was drawn from: training would not have noticed, later code would.
        assert torch.equal(torch.random.get_rng_state(), rng_after_healthy[0])
        assert random.getstate() == rng_after_healthy[1]


def test_the_header_records_the_profile_and_still_pairs(healthy_run, run_factory) -> None:
    profile = load_profile("rare-huge")
    healthy = LogReader(rank_dir(healthy_run, 0)).header
    faulty = LogReader(rank_dir(run_factory("faulty", fault_profile=profile, fault_seed=9, abft=True), 0)).header
    assert faulty.extra["fault_profile"] == {
        "name": "rare-huge",
        "sha256": profile.sha256,
        "seed": 9,
        "profile": profile.data,
    }
    assert profile_from_header(faulty.extra["fault_profile"]) == profile
    assert faulty.extra["abft"] is True and faulty.extra["sites"] == healthy.extra["sites"]
    for field in (
        "schema_version",
        "config",
        "config_fingerprint",
        "seed",
        "data_order_fingerprint",
        "fingerprint_algorithm",
        "world_size",
    ):
        assert getattr(faulty, field) == getattr(healthy, field), field
    assert pairing_differences(healthy, faulty) == []


def test_a_rule_naming_microbatches_fires_only_in_them(run_factory, write_profile) -> None:
    profile = write_profile(
        '[[fault]]\nops = ["mm"]\nphases = ["forward"]\nsteps = [1]\nmicrobatches = [1]\nkind = "bitflip"\n'
    )
    run = run_factory("second-microbatch", "run.steps=2", "data.microbatches=2", fault_profile=profile)
    faults = events(run, "fault")
    assert faults and {(f.step, f.fields["microbatch"]) for f in faults} == {(1, 1)}


def test_it_corrupts_any_model_and_logs_what_it_did(write_profile) -> None:
    profile = write_profile(
        'seed = 1\n[[fault]]\nops = ["addmm"]\nsites = "1"\nelements = 3\nkind = "stuck"\nvalue = 7.0\n'
    )
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    x = torch.randn(5, 4)
    with torch.no_grad():
        hidden = model[0](x)
        healthy_out = model[1](hidden)
    log: list[tuple[str, dict]] = []
    with FaultEmulator(profile, model, clock=lambda: (0, 0), sink=lambda k, f: log.append((k, f))):
        out = model(x)
    ((kind, fault),) = log
    assert kind == "fault" and fault["site"] == "1" and fault["op"] == "aten.addmm.default"
    assert fault["phase"] == "forward" and fault["elements"] == 3 and fault["corrupted"] == [7.0] * 3
    hit = torch.zeros(10, dtype=torch.bool)
    hit[fault["index"]] = True
    assert torch.equal(out.detach().flatten()[hit], torch.full((3,), 7.0))
    assert torch.equal(out.detach().flatten()[~hit], healthy_out.flatten()[~hit])
    assert fault["original"] == healthy_out.flatten()[hit].tolist()


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_rule_on_a_block_names_the_traced_site_inside_it_that_the_op_ran_in(write_profile, phase: str) -> None:
    """A rule on ``ffn`` hitting the matmul of a traced ``ffn.up`` happened in ``ffn.up``: the fault event says so
    (not ``ffn``), so the diff finds it at the site that diverged, and no untraced-module warning is given."""
    profile = write_profile(
        f'[[fault]]\nops = ["mm", "addmm"]\nsites = "ffn"\nphases = ["{phase}"]\nkind = "scale"\nfactor = 2.0\n'
    )
    model = nn.Sequential()
    model.add_module("ffn", nn.Sequential())
    model.ffn.add_module("up", nn.Linear(4, 8))
    model.ffn.add_module("act", nn.GELU())
    log: list[tuple[str, dict]] = []
    with (
        FaultEmulator(
            profile, model, clock=lambda: (0, 0), sink=lambda k, f: log.append((k, f)), sites=("ffn.up", "ffn.act")
        ),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()
    assert log and {(f["site"], f["phase"]) for _, f in log} == {("ffn.up", phase)}


def test_a_site_pattern_that_matches_no_module_is_an_error(write_profile) -> None:
    profile = write_profile('[[fault]]\nops = ["mm"]\nsites = "decoder.*"\nkind = "bitflip"\n')
    with pytest.raises(ConfigError, match=r"test-node.toml: fault\[0\].sites = 'decoder.\*' matches no module path"):
        FaultEmulator(profile, nn.Sequential(nn.Linear(2, 2)), clock=lambda: (0, 0), sink=lambda k, f: None)


@pytest.mark.slow
def test_the_loss_spike_profile_spikes_the_training_loss(run_factory) -> None:
    def losses(run) -> list[float]:
        return [e.fields["loss"] for e in events(run, "step")]

    healthy = losses(run_factory("healthy", "run.steps=13"))
    spiked = losses(run_factory("spiked", "run.steps=13", fault_profile=load_profile("loss-spike")))
    assert spiked[:10] == healthy[:10]
    assert spiked[10] > 20 * healthy[10] and spiked[11] > 20 * healthy[11]
    assert abs(spiked[12] - healthy[12]) < 0.5  # the spike passes; the weights carry a small scar


def test_a_rerun_draws_a_transient_rule_afresh_and_repeats_a_persistent_one(write_profile) -> None:
    """The clock's third element is the guard's attempt: a later moment for a transient rule, the same stuck
    unit for a persistent one; attempt 0 draws what a two-element clock draws."""
    model = nn.Sequential(nn.Linear(8, 64))
    x = torch.randn(5, 8)
    rule = '[[fault]]\nops = ["addmm"]\nsites = "0"\nelements = 3\nkind = "scale"\nfactor = [2.0, 50.0]\n'

    def indices(profile, clock) -> list[list[int]]:
        log: list[tuple[str, dict]] = []
        with FaultEmulator(profile, model, clock=clock, sink=lambda k, f: log.append((k, f))):
            model(x)
        return [[*f["index"], f["detail"]["factor"]] for _, f in log]

    transient = write_profile(rule, "transient")
    persistent = write_profile(rule + "persistent = true\n", "persistent")
    for profile in (transient, persistent):
        assert indices(profile, lambda: (3, 0)) == indices(profile, lambda: (3, 0, 0))
    first = indices(transient, lambda: (3, 0, 0))
    assert len(first) == 1
    assert indices(transient, lambda: (3, 0, 1)) != first != indices(transient, lambda: (3, 0, 2))
    again = indices(persistent, lambda: (3, 0, 0))
    assert again == first  # the same stream at attempt 0, whichever kind the rule is
    assert indices(persistent, lambda: (3, 0, 1)) == indices(persistent, lambda: (3, 0, 2)) == again


class Calls(Interceptor):
    """Every call of ``ops`` by the workload (not sdctrace's own): (step, microbatch, op, phase, result size), with
    the phase as docs/faults.md defines it: backward in the autograd engine, forward with grad on, else none."""

    def __init__(self, tracer: Tracer, ops: frozenset) -> None:
        self.tracer = tracer
        self.ops = ops
        self.calls: list[tuple[int, int, object, str | None, int]] = []

    def intercept(self, func, args, kwargs, call):  # noqa: ANN001, ANN201
        out = call(*args, **kwargs)
        backward = torch._C._current_graph_task_id() != -1
        phase = "backward" if backward else "forward" if torch.is_grad_enabled() else None
        size = out.numel() if isinstance(out, torch.Tensor) else 0
        self.calls.append((self.tracer.step_index, self.tracer.microbatch_index, func, phase, size))
        return out


def train(tmp_path: Path, name: str, steps: int, make_mode: Callable[[Tracer, nn.Module], Interceptor]):  # noqa: ANN201
    """Train the small workload for ``steps`` steps inside the interceptor ``make_mode`` builds; return it."""
    cfg = small_config()
    w = build(cfg)
    with Tracer(w.model, w.optimizer, out=tmp_path / name, run=RunInfo(name, config=cfg.to_dict())) as tracer:
        with make_mode(tracer, w.model) as mode:
            for step in range(steps):
                with tracer.step(step):
                    run_step(w, step, tracer)
    return mode


@pytest.mark.slow
def test_faults_land_on_the_calls_the_documented_draws_pick(tmp_path: Path, write_profile) -> None:
    """Replays docs/faults.md's draws on an unfaulted twin's op calls: one draw per eligible call, in call
    order, from a generator per (step, microbatch); a hit then samples its element. add_ also runs in the
    optimizer step (no phase: no draw) and the Tracer's fingerprints run add and mul (its own ops: no draw).
    The autograd engine sums gradients with add_ or add, as it can reuse a buffer or not: the rule names both."""
    rule = 'ops = ["mm", "add", "add_", "mul"]\np_call = 0.05\nkind = "stuck"\nvalue = 0\n'
    profile = write_profile(f"seed = 4\n[[fault]]\n{rule}")
    seed, steps = 7, 3
    named = frozenset({torch.ops.aten.mm, torch.ops.aten.add, torch.ops.aten.add_, torch.ops.aten.mul})
    twin = train(tmp_path, "twin", steps, lambda tracer, model: Calls(tracer, named))
    draws: dict[tuple[int, int], random.Random] = {}
    expected = []
    for step, microbatch, op, phase, size in twin.calls:
        if op.overloadpacket in named and phase is not None:
            key = (step, microbatch)
            rng = draws.setdefault(key, random.Random(f"sdctrace-calls:{profile.seed}:{seed}:{step}:{microbatch}"))
            if rng.random() < 0.05:
                expected.append((step, microbatch, str(op), phase, rng.sample(range(size), 1)))

    log: list[dict] = []

    def emulated(tracer: Tracer, model: nn.Module) -> FaultEmulator:
        def clock() -> tuple[int, int]:
            return tracer.step_index, tracer.microbatch_index

        def sink(kind: str, fields: dict) -> None:
            log.append(fields | {"step": clock()[0]})

        return FaultEmulator(profile, model, clock=clock, sink=sink, seed=seed)

    train(tmp_path, "faulty", steps, emulated)
    got = [(f["step"], f["microbatch"], f["op"], f["phase"], f["index"]) for f in log]
    assert got == expected
    assert {op for _, _, op, _, _ in got} >= {"aten.mm.default", "aten.mul.Tensor", "aten.add_.Tensor"}
    assert {phase for *_, phase, _ in got} == {"forward", "backward"} and {s for s, *_ in got} == set(range(steps))


def test_a_fault_in_an_op_on_dtensors_hits_this_ranks_shard_and_names_its_site(tmp_path: Path, write_profile) -> None:
    """Under tensor parallelism the parallelized linears compute on DTensors: the emulator corrupts this rank's
    local shard of the result (it used to stop the run reading a DTensor's storage)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from tests.tracer.test_sites import one_rank_group

    profile = write_profile('[[fault]]\nops = ["matmul"]\nsites = "mlp"\nkind = "stuck"\nvalue = 7.0\n')
    with one_rank_group(tmp_path):
        model = nn.Sequential()
        model.add_module("mlp", nn.Sequential(nn.Linear(4, 8)))
        parallelize_module(model.mlp, init_device_mesh("cpu", (1,)), {"0": ColwiseParallel()})
        x = torch.randn(3, 4)
        healthy = model(x).detach().clone()
        log: list[tuple[str, dict]] = []
        with FaultEmulator(
            profile, model, clock=lambda: (0, 0), sink=lambda k, f: log.append((k, f)), sites=("mlp.0",)
        ):
            out = model(x).detach()
    ((_, fault),) = log
    assert (fault["site"], fault["op"], fault["corrupted"]) == ("mlp.0", "aten.addmm.default", [7.0])
    changed = (out != healthy).flatten().nonzero().flatten().tolist()
    assert changed == fault["index"] and out.flatten()[changed].tolist() == [7.0]
