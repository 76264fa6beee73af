"""Replay: zero on a healthy pair, isolation by lockstep, exact noise, divergences caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from faults import FaultEmulator, load_profile
from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile, suspect_from_run
from tests.support import ONE_FLIP, events, small_config
from tracer.checkpoint import load_checkpoint
from tracer.errors import ConfigError, ValidationError
from tracer.log import LogReader, LogWriter, rank_dir
from tracer.log.records import Phase, TensorRecord
from workload.model import Transformer
from workload.protocol import run_step
from workload.reference import build


@pytest.fixture
def one_site_profile(tmp_path: Path) -> Path:
    path = tmp_path / "one-site.toml"
    path.write_text(ONE_FLIP, encoding="utf-8")
    return path


def replay(golden: Path, suspect, steps: str, mode: str, out: Path, **kw) -> Path:
    Replayer(ReplayRequest(golden, out, parse_steps(steps), suspect, mode=mode, progress=False, **kw)).run()
    return out


@pytest.mark.slow
def test_healthy_pair_gives_exactly_zero_in_both_modes(run_factory, tmp_path: Path) -> None:
    golden, twin = run_factory("golden", "run.steps=5"), run_factory("twin", "run.steps=5")
    header = LogReader(rank_dir(golden, 0)).header
    for suspect in (suspect_from_run(twin, header, golden), suspect_from_profile("healthy-node")):
        tag = suspect.label.replace(":", "-")
        lock = replay(golden, suspect, "1:4", "lockstep", tmp_path / f"lock-{tag}")
        sites = events(lock, "site_mismatch")
        assert len(sites) == 3 * 2 * 4 * 2  # steps x microbatches x sites x phases
        assert all(e.fields["mismatched"] == 0 and e.fields["frequency"] == 0.0 for e in sites)
        sync = replay(golden, suspect, "1:4", "param-sync", tmp_path / f"sync-{tag}")
        noise = events(sync, "grad_noise")
        assert noise and all(e.fields["diff_l2"] == 0.0 and e.fields["ratio"] == 0.0 for e in noise)
        assert all(e.fields["golden_l2"] > 0 for e in noise)
    h = LogReader(rank_dir(sync, 0)).header
    assert h.role == "replay" and h.config_fingerprint == header.config_fingerprint
    assert h.extra["replay"]["mode"] == "param-sync" and h.extra["replay"]["steps"] == [1, 4]


@pytest.mark.slow
def test_a_step_without_faults_executes_once(run_factory, one_site_profile: Path, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=5", "run.checkpoint_every=2")
    twin = run_factory("twin", "run.steps=5", "run.checkpoint_every=2")
    header = LogReader(rank_dir(golden, 0)).header
    forwards = 0

    def count(module: torch.nn.Module, args: object) -> None:
        nonlocal forwards
        forwards += isinstance(module, Transformer)

    suspects = {
        "this machine": suspect_from_run(twin, header, golden),
        "emulated, no fault fires": suspect_from_profile("healthy-node"),
        "emulated, a fault at step 3": suspect_from_profile(str(one_site_profile)),
    }
    runs = {}
    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        for i, (what, suspect) in enumerate(suspects.items()):
            forwards = 0
            out = replay(golden, suspect, "2:4", "lockstep", tmp_path / f"replay-{i}")
            runs[what] = forwards
            faults = {e.step for e in events(out, "fault")}
            assert faults == ({3} if "step 3" in what else set()), what
    finally:
        handle.remove()
    # Steps 2 and 3 from the checkpoint at 2, two microbatches each. A step runs once when the suspect is this
    # machine or its emulator has no rule armed in it; step 3 of the faulty node, armed, runs twice in lockstep:
    # the golden re-execution and the suspect (tests/replay/test_replay_executions.py counts every kind of step).
    assert runs == {
        "this machine": 2 * 2,
        "emulated, no fault fires": 2 * 2,
        "emulated, a fault at step 3": (1 + 2) * 2,
    }


@pytest.mark.slow
def test_lockstep_isolates_the_faulty_site(run_factory, one_site_profile: Path, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=5", "run.checkpoint_every=2")
    out = replay(golden, suspect_from_profile(str(one_site_profile)), "2:5", "lockstep", tmp_path / "lock")
    faults = events(out, "fault")
    assert faults and {(f.step, f.fields["site"], f.fields["phase"]) for f in faults} == {
        (3, "layers.1.feed_forward", "forward")
    }
    hit = {
        (e.step, e.fields["site"], e.fields["phase"]) for e in events(out, "site_mismatch") if e.fields["mismatched"]
    }
    # The faulty site only: downstream sites computed on golden inputs. Its own backward
    # may differ too (it reuses its corrupted activations), nothing else may.
    assert (3, "layers.1.feed_forward", "forward") in hit
    assert hit <= {(3, "layers.1.feed_forward", "forward"), (3, "layers.1.feed_forward", "backward")}
    worst = max(e.fields["severity"] or 0 for e in events(out, "site_mismatch"))
    assert worst > 0


@pytest.mark.slow
def test_noise_to_signal_equals_an_independent_computation(run_factory, one_site_profile: Path, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=5", "run.checkpoint_every=3")
    out = replay(golden, suspect_from_profile(str(one_site_profile)), "3:4", "param-sync", tmp_path / "sync")
    total = next(e for e in events(out, "grad_noise") if e.fields["name"] == "*")
    assert total.step == 3 and total.fields["ratio"] > 0

    def gradients(profile=None) -> dict[str, np.ndarray]:
        w = build(small_config("run.steps=5", "run.checkpoint_every=3"))
        load_checkpoint(golden, 3).restore(w.model, w.optimizer)
        grads: dict[str, np.ndarray] = {}
        names = {id(p): n for n, p in w.model.named_parameters()}

        def keep(opt, args, kwargs) -> None:
            for p in (p for g in opt.param_groups for p in g["params"]):
                grads[names[id(p)]] = p.grad.detach().double().numpy().copy()

        w.optimizer.register_step_pre_hook(keep)

        class Clock:
            step_index, microbatch_index = 3, 0

            def microbatch(self, mb, inputs=None) -> None:
                self.microbatch_index = mb

            def loss(self, value) -> None:
                pass

        clock = Clock()
        if profile is None:
            run_step(w, 3, clock)
        else:
            with FaultEmulator(profile, w.model, clock=lambda: (3, clock.microbatch_index), sink=lambda k, f: None):
                run_step(w, 3, clock)
        return grads

    g_h, g_s = gradients(), gradients(load_profile(one_site_profile))
    diff = np.sqrt(sum(np.sum((g_s[n] - g_h[n]) ** 2) for n in g_h))
    norm = np.sqrt(sum(np.sum(g_h[n] ** 2) for n in g_h))
    assert total.fields["ratio"] == pytest.approx(diff / norm, rel=1e-12)
    per_param = {e.fields["name"]: e.fields["ratio"] for e in events(out, "grad_noise")}
    name = "layers.1.feed_forward.w2.weight"
    assert per_param[name] == pytest.approx(
        np.linalg.norm(g_s[name] - g_h[name]) / np.linalg.norm(g_h[name]), rel=1e-12
    )


@pytest.mark.slow
def test_reconstruction_catches_an_altered_fingerprint(run_factory, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=6", "run.checkpoint_every=3")
    forged = tmp_path / "forged"
    shutil.copytree(golden / "checkpoints", forged / "checkpoints")
    reader = LogReader(rank_dir(golden, 0))
    with LogWriter(rank_dir(forged, 0), reader.header) as w:
        for rec in reader.records():
            if isinstance(rec, TensorRecord):
                if (rec.step, rec.microbatch, rec.name, rec.phase) == (4, 1, "layers.0.feed_forward", Phase.BACKWARD):
                    rec = TensorRecord(
                        rec.step,
                        rec.microbatch,
                        rec.name,
                        rec.phase,
                        rec.fingerprint ^ 1,
                        rec.l2,
                        rec.absmax,
                        rec.nan,
                        rec.inf,
                        rec.meta,
                    )
                w.write_tensor(rec)
            else:
                w.write_event(rec)
    out = tmp_path / "replay"
    with pytest.raises(ValidationError, match=r"step 4, microbatch 1, backward layers\.0\.feed_forward"):
        replay(forged, suspect_from_profile("healthy-node"), "5:6", "lockstep", out)
    (div,) = events(out, "replay_divergence")
    assert (div.step, div.fields["name"], div.fields["phase"]) == (4, "layers.0.feed_forward", int(Phase.BACKWARD))


@pytest.mark.slow
def test_bad_input_is_named(run_factory, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=4", "run.checkpoint_every=2")
    other = run_factory("other", "run.steps=4", "train.seed=5", "data.shuffle_seed=3")
    header = LogReader(rank_dir(golden, 0)).header
    with pytest.raises(ValidationError, match=r"do not pair.*config_fingerprint.*seed: 0 vs 5.*data_order_fingerprint"):
        suspect_from_run(other, header, golden)
    no_ckpt = run_factory("no-ckpt", "run.steps=3", "run.checkpoint_every=0")
    with pytest.raises(ValidationError, match="no checkpoint at or before step 1"):
        Replayer(ReplayRequest(no_ckpt, tmp_path / "x", parse_steps("1:2"), suspect_from_profile("healthy-node")))
    with pytest.raises(ValidationError, match="reach beyond the recorded steps 0..3"):
        Replayer(ReplayRequest(golden, tmp_path / "x", parse_steps("2:9"), suspect_from_profile("healthy-node")))
    with pytest.raises(ValidationError, match="no captured tensor for step 2"):
        replay(golden, suspect_from_profile("healthy-node"), "2:3", "lockstep", tmp_path / "y", golden_from="blobs")
    for bad in ("x", "5:5", "3:1"):
        with pytest.raises(ConfigError, match="--steps"):
            parse_steps(bad)


def test_golden_blobs_are_used_when_captured(run_factory, tmp_path: Path) -> None:
    golden = run_factory("golden", "run.steps=4", "run.checkpoint_every=2", trace=_capture_step(2))
    out = replay(golden, suspect_from_profile("healthy-node"), "2:3", "lockstep", tmp_path / "r", golden_from="blobs")
    assert all(e.fields["mismatched"] == 0 for e in events(out, "site_mismatch"))


def _capture_step(step: int):
    from tracer.options import CapturePolicy, TraceOptions

    return TraceOptions(capture=CapturePolicy(steps=frozenset({step})))


@pytest.mark.slow
def test_replay_cli_at_first_divergence(run_factory, one_site_profile: Path, tmp_path: Path, capsys) -> None:
    from sdc.cli import main

    golden = run_factory("golden", "run.steps=5", "run.checkpoint_every=2")
    suspect = run_factory(
        "suspect", "run.steps=5", "run.checkpoint_every=2", fault_profile=load_profile(one_site_profile)
    )
    # The suspect ran a profile that is not shipped: replay re-creates it from the suspect's run header.
    code = main(
        [
            "replay",
            "--golden",
            str(golden),
            "--suspect",
            str(suspect),
            "--at-first-divergence",
            "--out",
            str(tmp_path / "around"),
            "--quiet",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and "replaying steps 2:5" in text
    assert {e.step for e in events(tmp_path / "around", "fault")} == {3}
    code = main(
        [
            "replay",
            "--golden",
            str(golden),
            "--fault-profile",
            str(one_site_profile),
            "--steps",
            "3:4",
            "--mode",
            "lockstep",
            "--out",
            str(tmp_path / "r"),
            "--quiet",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and "step     3: worst site mismatch frequency" in text and "1 injected fault" not in text


@pytest.mark.slow
def test_a_golden_log_of_schema_1_still_replays_with_every_fingerprint_checked(run_factory, tmp_path: Path) -> None:
    """Schema 1 labelled every gradient microbatch 0, schema 2 the microbatch that last changed it: replay indexes a
    step's gradients by name, so an old golden log's gradients are checked too, not silently skipped."""
    import dataclasses

    golden = run_factory("golden", "run.steps=3", "run.checkpoint_every=2")
    old = tmp_path / "old"
    shutil.copytree(golden, old)
    reader = LogReader(rank_dir(golden, 0))
    grads = 0
    shutil.rmtree(rank_dir(old, 0))
    with LogWriter(rank_dir(old, 0), dataclasses.replace(reader.header, schema_version=1)) as w:
        for r in reader.records():
            if isinstance(r, TensorRecord):
                grads += r.phase == Phase.GRAD and r.microbatch != 0
                w.write_tensor(dataclasses.replace(r, microbatch=0) if r.phase == Phase.GRAD else r)
            else:
                w.write_event(r)
    assert grads > 0  # the small config accumulates two microbatches: schema 2 labels its gradients 1
    healthy = suspect_from_profile("healthy-node")
    checked = [
        Replayer(
            ReplayRequest(
                run, tmp_path / f"replay-{run.name}", parse_steps("2:3"), healthy, mode="param-sync", progress=False
            )
        )
        .run()
        .checked
        for run in (golden, old)
    ]
    assert checked[0] == checked[1] > 0
