"""The fault emulator on real recorded runs: where faults land, reproducibility, no side effects."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from faults import FaultEmulator, load_profile, profile_from_header
from tests.faults.support import events
from tracer.compare import compare_runs
from tracer.errors import ConfigError
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase
from tracer.pairing import pairing_differences

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
    assert first is not None and first.a is not None and first.b is not None
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
    never = write_profile('[[fault]]\nops = ["matmul", "elementwise", "reduction", "softmax"]\n'
                          'sites = "(.*_)?norm|.*w2|layers.0"\np_call = 0.0\nkind = "bitflip"\n')
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
    assert faulty.extra["fault_profile"] == {"name": "rare-huge", "sha256": profile.sha256, "seed": 9,
                                             "profile": profile.data}
    assert profile_from_header(faulty.extra["fault_profile"]) == profile
    assert faulty.extra["abft"] is True and faulty.extra["sites"] == healthy.extra["sites"]
    for field in ("schema_version", "config", "config_fingerprint", "seed", "data_order_fingerprint",
                  "fingerprint_algorithm", "world_size"):
        assert getattr(faulty, field) == getattr(healthy, field), field
    assert pairing_differences(healthy, faulty) == []



def test_a_rule_naming_microbatches_fires_only_in_them(run_factory, write_profile) -> None:
    profile = write_profile('[[fault]]\nops = ["mm"]\nphases = ["forward"]\nsteps = [1]\nmicrobatches = [1]\n'
                            'kind = "bitflip"\n')
    run = run_factory("second-microbatch", "run.steps=2", "data.microbatches=2", fault_profile=profile)
    faults = events(run, "fault")
    assert faults and {(f.step, f.fields["microbatch"]) for f in faults} == {(1, 1)}

def test_it_corrupts_any_model_and_logs_what_it_did(write_profile) -> None:
    profile = write_profile('seed = 1\n[[fault]]\nops = ["addmm"]\nsites = "1"\nelements = 3\nkind = "stuck"\nvalue = 7.0\n')
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
