"""Faults in the optimizer update (rule phase "optimizer"): a plain model trained with AdamW, traced, under the
real emulator. The update's op (``addcdiv_``, or ``_foreach_addcdiv_`` with ``foreach=True``) is corrupted at the
step the rule names and nowhere else, so the first fingerprint that differs from a clean run's is a parameter's
(PARAM) at that step; a rule for the forward leaves the optimizer alone, whose steps stay paused. The C++ gate
and Python alone give the same faults."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from faults import FaultProfile, scope
from faults.native_kernel import NATIVE
from tests.faults.support import first_divergence, train_mlp
from tracer import kernel
from tracer.log.records import Phase

STEPS, FAULT_STEP = 5, 2


def update_rule(op: str = "addcdiv_", phases: str = '["optimizer"]') -> str:
    """One element of what ``op`` writes at step FAULT_STEP, scaled by 1.5."""
    return (
        f'[[fault]]\nops = ["{op}"]\nphases = {phases}\nsteps = [{FAULT_STEP}]\nelements = 1\n'
        'kind = "scale"\nfactor = 1.5\n'
    )


def train(out: Path, profile: FaultProfile | None, *, foreach: bool = False) -> dict:
    return train_mlp(out, profile, steps=STEPS, foreach=foreach)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return train(tmp_path_factory.mktemp("clean") / "run", None)


def test_an_update_fault_changes_the_parameters_at_its_step_and_nothing_before(
    clean, tmp_path: Path, write_profile
) -> None:
    got = train(tmp_path / "run", write_profile(update_rule()))
    # AdamW on the CPU updates one parameter at a time: each of the 4 updates of the step is one call, each hit.
    assert [step for step, _ in got["faults"]] == [FAULT_STEP] * 4
    for _, fault in got["faults"]:
        assert fault["phase"] == "optimizer" and fault["site"] == ""
        assert fault["op"] == "aten.addcdiv_.default" and fault["elements"] == 1
        assert fault["corrupted"] == [pytest.approx(fault["original"][0] * 1.5)]
    first = first_divergence(clean["tensors"], got["tensors"])
    assert (first.step, first.phase) == (FAULT_STEP, Phase.PARAM), first
    # The optimizer steps ran unpaused only where the rule was armed: elsewhere the pause still saves its cost.
    assert got["paused"] == [step != FAULT_STEP for step in range(STEPS)]
    assert clean["paused"] == [False] * STEPS  # no emulator at all


def test_a_foreach_update_fault_hits_one_element_of_one_tensor_of_the_list(
    clean, tmp_path: Path, write_profile
) -> None:
    foreach_clean = train(tmp_path / "clean", None, foreach=True)
    got = train(tmp_path / "run", write_profile(update_rule("_foreach_addcdiv_")), foreach=True)
    ((step, fault),) = got["faults"]
    assert (step, fault["phase"], fault["op"]) == (FAULT_STEP, "optimizer", "aten._foreach_addcdiv_.ScalarList")
    assert fault["elements"] == 1 and len(fault["index"]) == 1
    first = first_divergence(foreach_clean["tensors"], got["tensors"])
    assert (first.step, first.phase) == (FAULT_STEP, Phase.PARAM)
    apart = {
        r.name
        for c, r in zip(foreach_clean["tensors"], got["tensors"])
        if c.fingerprint != r.fingerprint and r.step == FAULT_STEP and r.phase == Phase.PARAM
    }
    assert len(apart) == 1  # one tensor of the list


def test_a_forward_rule_on_the_same_op_leaves_the_optimizer_alone_and_paused(
    clean, tmp_path: Path, write_profile
) -> None:
    got = train(tmp_path / "run", write_profile(update_rule(phases='["forward"]')))
    assert got["faults"] == [] and got["paused"] == [True] * STEPS
    assert [r.fingerprint for r in got["tensors"]] == [r.fingerprint for r in clean["tensors"]]


@pytest.mark.parametrize("op", ["addcdiv_", "_foreach_addcdiv_"])
def test_the_gate_and_python_alone_give_the_same_update_faults(
    monkeypatch, tmp_path: Path, write_profile, op: str
) -> None:
    built = kernel.load(NATIVE)
    if built is None:
        pytest.skip("faults' native kernel is not built here: `python -m faults.native_kernel`")
    profile = write_profile(
        "seed = 2\n"
        + update_rule(op)
        .replace("elements = 1", "elements = 3\np_call = 0.5")
        .replace(f"steps = [{FAULT_STEP}]", "start = 1")
    )
    got: dict[str, dict] = {}
    for name, module in (("python", None), ("gate", built)):
        monkeypatch.setattr(scope, "_native_state", [module])
        got[name] = train(tmp_path / name, profile, foreach=op.startswith("_foreach"))
    calls = 4 * (1 if op.startswith("_foreach") else 4)  # steps 1-4: one foreach call, or one per parameter
    assert got["gate"]["faults"] == got["python"]["faults"] and 2 <= len(got["gate"]["faults"]) < calls
    assert all(torch.equal(a, b) for a, b in zip(got["gate"]["params"], got["python"]["params"]))
