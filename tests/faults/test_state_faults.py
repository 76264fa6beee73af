"""State faults (a profile's ``[[state]]`` rules): one bit of one parameter element flipped right after the
optimizer update of a step. A small MLP trained with AdamW and traced, under the real emulator, against its clean
twin: nothing differs before the flip, the parameter differs by exactly one ulp at that element after that step,
and the first fingerprint that differs is that parameter's at that step; the reference model recorded by
`record_run` says the same through `tracer.compare`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from faults import FaultProfile, load_profile
from faults.corrupt import field_bits
from faults.emulator import FaultEmulator
from jobs.record import record_run
from tests.faults.support import events, first_divergence, train_mlp
from tests.parallel.test_fsdp2 import torchrun
from tests.parallel.test_ranks import rank_events
from tests.support import small_config
from tracer.compare import compare_runs
from tracer.errors import ConfigError
from tracer.log.records import Phase

STEPS, FAULT_STEP, PARAMETER = 5, 2, "2.weight"


def state_rule(parameter: str = PARAMETER, step: int = FAULT_STEP, extra: str = "element = 13\n") -> str:
    return f'[[state]]\nparameter = "{parameter}"\nstep = {step}\n{extra}'


def train(out: Path, profile: FaultProfile | None, *, fault_seed: int = 0) -> dict:
    return train_mlp(out, profile, steps=STEPS, fault_seed=fault_seed)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return train(tmp_path_factory.mktemp("clean") / "run", None)


def test_one_ulp_of_one_element_after_the_update_and_nothing_before(clean, tmp_path: Path, write_profile) -> None:
    got = train(tmp_path / "run", write_profile(state_rule()))
    for step in range(FAULT_STEP):
        for name, p in clean["after"][step].items():
            assert torch.equal(got["after"][step][name], p), (step, name)
    for name, p in clean["after"][FAULT_STEP].items():
        q = got["after"][FAULT_STEP][name]
        if name != PARAMETER:
            assert torch.equal(q, p), name
            continue
        differs = (q != p).reshape(-1).nonzero().flatten().tolist()
        assert differs == [13]
        a, b = p.reshape(-1)[13], q.reshape(-1)[13]
        assert torch.equal(torch.nextafter(a, torch.tensor(math.inf if b > a else -math.inf)), b)
        assert (a.view(torch.int32) ^ b.view(torch.int32)).item() == 1  # bit 0: the last mantissa bit
    # The event names the parameter, the element and the bit, at the step.
    ((step, fault),) = got["faults"]
    assert step == FAULT_STEP
    assert fault["op"] == "state" and fault["phase"] == "optimizer" and fault["kind"] == "bitflip"
    assert fault["index"] == [13] and fault["detail"]["parameter"] == PARAMETER and fault["detail"]["bits"] == [0]
    assert fault["original"] == [clean["after"][FAULT_STEP][PARAMETER].reshape(-1)[13].item()]
    # The first fingerprint that differs is that parameter's, after that step's update.
    first = first_divergence(clean["tensors"], got["tensors"])
    assert (first.step, first.phase, first.name) == (FAULT_STEP, Phase.PARAM, PARAMETER)


def test_a_drawn_element_and_bit_are_the_same_for_the_same_seeds(tmp_path: Path, write_profile) -> None:
    profile = write_profile(state_rule(extra='bits = "exponent"\n'))
    runs = [train(tmp_path / f"run{i}", profile, fault_seed=seed) for i, seed in enumerate((4, 4, 5))]
    (_, a), (_, b), (_, c) = (run["faults"][0] for run in runs)
    assert a == b
    assert a["detail"]["bits"][0] in field_bits(torch.float32, "exponent")
    assert 0 <= a["index"][0] < 16 * 8 and (a["index"], a["detail"]["bits"]) != (c["index"], c["detail"]["bits"])


def test_the_reference_models_first_divergence_is_the_flipped_parameter(
    healthy_run: Path, tmp_path: Path, write_profile
) -> None:
    name = "layers.0.attention.wo.weight"
    profile = write_profile(state_rule(name, 1, "element = 5\nbits = 3\n"))
    out = tmp_path / "state"
    record_run(small_config(), out, node_label="state", fault_profile=profile, progress=False)
    (fault,) = events(out, "fault")
    assert fault.step == 1 and fault.fields["detail"]["parameter"] == name and fault.fields["detail"]["bits"] == [3]
    first = compare_runs(healthy_run, out).first
    assert first is not None and (first.step, first.phase, first.name) == (1, Phase.PARAM, name)


@pytest.mark.parametrize(
    "rule, message",
    [
        (state_rule("2.bias.nope"), "state\\[0\\].parameter = '2.bias.nope' is no parameter of the model"),
        (state_rule(extra="element = 128\n"), "state\\[0\\].element = 128 is outside 2.weight's 128 elements"),
        (state_rule(extra="bits = 32\n"), "state\\[0\\].bits = 32 is outside the 32 bits"),
        (state_rule(extra='bits = "high"\n'), "bits"),
        (state_rule(step=-1), "step"),
    ],
)
def test_a_state_rule_that_does_not_fit_is_an_error(rule: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(rule, encoding="utf-8")
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    with pytest.raises(ConfigError, match=message):
        FaultEmulator(load_profile(path), model, clock=lambda: (0, 0), sink=lambda *_: None)


@pytest.mark.slow  # torchrun launches ranks as processes
def test_a_state_fault_in_an_fsdp2_shard_is_rank_1s_first_divergence(fsdp2_golden: Path, tmp_path: Path) -> None:
    """FSDP2 (``fully_shard``, DTensor parameters) on 2 gloo ranks: the flip lands in rank 1's shard after step 3's
    update, and the first record of the two runs that differs is that shard's PARAM record at step 3."""
    name = "blocks.1.mlp.0.weight"
    (tmp_path / "rank1.toml").write_text(state_rule(name, 3, "element = 5\nranks = [1]\n"), encoding="utf-8")
    suspect = torchrun(tmp_path / "suspect", "--fault-profile", str(tmp_path / "rank1.toml"))
    first = compare_runs(fsdp2_golden, suspect).first
    assert first is not None and (first.rank, first.step, first.phase, first.name) == (1, 3, Phase.PARAM, name)
    (fault,) = rank_events(suspect, 1, "fault")
    assert fault.step == 3 and fault.fields["index"] == [5] and fault.fields["detail"]["parameter"] == name
    assert rank_events(suspect, 0, "fault") == []
