"""The ABFT checker: silent on healthy runs, flags large matmul faults, blind outside matmuls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faults import FaultEmulator, load_profile
from faults.abft import AbftChecker, check_matmul, error_factor
from tests.faults.support import events

aten = torch.ops.aten
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def operands(dtype: torch.dtype, *shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def calls(dtype: torch.dtype) -> list[tuple]:
    """(op, args, kwargs, result) for every checked op, with inner dimension 300."""
    a, b = operands(dtype, 40, 300, seed=1), operands(dtype, 300, 30, seed=2)
    a3, b3 = operands(dtype, 3, 40, 300, seed=3), operands(dtype, 3, 300, 30, seed=4)
    bias, bias3 = operands(dtype, 30, seed=5), operands(dtype, 3, 40, 30, seed=6)
    x, w = operands(dtype, 2, 20, 300, seed=7), operands(dtype, 30, 300, seed=8)
    scale = {"beta": 0.5, "alpha": 2.0}
    return [
        (aten.mm.default, (a, b), {}, a @ b),
        (aten.addmm.default, (bias, a, b), scale, torch.addmm(bias, a, b, **scale)),
        (aten.bmm.default, (a3, b3), {}, a3 @ b3),
        (aten.baddbmm.default, (bias3, a3, b3), scale, torch.baddbmm(bias3, a3, b3, **scale)),
        (aten.linear.default, (x, w, bias), {}, F.linear(x, w, bias)),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_correct_products_pass_and_a_corrupted_element_is_flagged(dtype: torch.dtype) -> None:
    for op, args, kwargs, c in calls(dtype):
        ok = check_matmul(op, args, kwargs, c)
        assert not ok.flagged and ok.residual <= ok.bound, (op, ok)
        assert ok.shape[1] == 300
        bad = c.clone()
        bad.view(-1)[17] += 64 * c.abs().max()
        flagged = check_matmul(op, args, kwargs, bad)
        assert flagged.flagged and flagged.residual > flagged.bound, (op, flagged)
        nan = c.clone()
        nan.view(-1)[3] = float("nan")
        assert check_matmul(op, args, kwargs, nan).flagged


def naive_check(op, args: tuple, kwargs: dict, c: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    """docs/faults.md's residuals, magnitude checksums and bounds of every column and row, from materialised
    float64 matrices."""
    alpha, beta = kwargs.get("alpha", 1.0), kwargs.get("beta", 1.0)
    if op is aten.linear.default:
        x, w, d = args
        a, b, alpha, beta = x.reshape(1, -1, w.shape[1]), w.T[None], 1.0, 1.0
    elif op in (aten.mm.default, aten.bmm.default):
        (a, b), d = args, None
    else:
        d, a, b = args
    a, b = (t.double() if t.dim() == 3 else t.double()[None] for t in (a, b))
    c = c.double().reshape(a.shape[0], a.shape[1], b.shape[2])
    expected, magnitude = alpha * a @ b, abs(alpha) * a.abs() @ b.abs()  # summed below: the checksums
    if d is not None:
        d = d.double().expand(c.shape).clone()
        expected, magnitude = expected + beta * d, magnitude + abs(beta) * d.abs()
    residual = torch.cat([(c - expected).sum(1).flatten(), (c - expected).sum(2).flatten()]).abs()
    magnitude = torch.cat([magnitude.sum(1).flatten(), magnitude.sum(2).flatten()])
    return residual, magnitude, 2.0 * error_factor(a.shape[2], args[-1].dtype, torch.device("cpu")) * magnitude


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_residual_and_bound_are_the_documented_ones_at_the_worst_row_or_column(dtype: torch.dtype) -> None:
    """Checked against the definition with every matrix materialised, broadcast biases included."""
    a, b = operands(dtype, 40, 300, seed=1), operands(dtype, 300, 30, seed=2)
    a3, b3 = operands(dtype, 3, 40, 300, seed=3), operands(dtype, 3, 300, 30, seed=4)
    column, row3 = operands(dtype, 40, 1, seed=5), operands(dtype, 30, seed=6)
    broadcast = [
        (aten.addmm.default, (column, a, b), {"beta": -1.5}, torch.addmm(column, a, b, beta=-1.5)),
        (aten.baddbmm.default, (row3, a3, b3), {"alpha": 0.5}, torch.baddbmm(row3, a3, b3, alpha=0.5)),
    ]
    for op, args, kwargs, c in calls(dtype) + broadcast:
        for corrupt in (False, True):
            if corrupt:
                c = c.clone()
                c.view(-1)[11] *= 3
            result = check_matmul(op, args, kwargs, c)
            residual, magnitude, bound = naive_check(op, args, kwargs, c)
            # Evaluated in another order, a float64 checksum differs by far less than this.
            slack = 1e-12 * magnitude
            assert result.flagged == bool((residual > bound).any()), (op, corrupt)
            reported = ((residual - result.residual).abs() <= slack) & torch.isclose(
                bound, torch.tensor(result.bound, dtype=torch.float64), rtol=1e-12
            )
            if result.flagged:  # a row or column over its bound
                assert (reported & (residual > bound)).any(), (op, corrupt, result)
            else:  # the largest residual / bound
                assert reported.any(), (op, corrupt, result)
                assert ((residual - slack) / bound).max() <= result.residual / result.bound * (1 + 1e-12), op


def test_the_bound_grows_with_the_inner_dimension_and_shrinks_with_precision() -> None:
    cpu = torch.device("cpu")
    assert error_factor(128, torch.float32, cpu) < error_factor(4096, torch.float32, cpu)
    assert error_factor(128, torch.float64, cpu) < error_factor(128, torch.float32, cpu)
    assert error_factor(128, torch.float32, cpu) < error_factor(128, torch.float16, cpu)
    assert error_factor(128, torch.float16, cpu) < error_factor(128, torch.bfloat16, cpu)
    # gamma_n = n u / (1 - n u) with n = k + 2 and float32's u = 2^-24, nothing else on the CPU.
    assert error_factor(126, torch.float32, cpu) == pytest.approx(128 * 2.0**-24 / (1 - 128 * 2.0**-24))


def verdicts(run) -> list[dict]:
    return [e.fields | {"step": e.step} for e in events(run, "abft")]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_healthy_run_is_never_flagged(run_factory, dtype: str) -> None:
    checks = verdicts(run_factory("healthy", f"model.dtype={dtype}", abft=True))
    assert checks and all(c["verdict"] == "ok" and c["residual"] <= c["bound"] for c in checks)
    assert {c["phase"] for c in checks} == {"forward", "backward"}
    assert {c["op"] for c in checks} == {"aten.mm.default"}
    assert {c["site"] for c in checks} >= {"layers.0.attention", "layers.1.feed_forward", ""}
    assert {c["step"] for c in checks} == {0, 1, 2, 3}


@pytest.mark.slow
def test_a_large_matmul_fault_is_flagged_where_it_was_injected(run_factory, write_profile) -> None:
    profile = write_profile(
        '[[fault]]\nops = ["mm"]\nsites = "layers\\\\.0\\\\.feed_forward"\nkind = "bitflip"\nbits = 30\n'
        "elements = 2\nsteps = [1]\n"
    )
    run = run_factory("faulty", fault_profile=profile, abft=True)
    faults = events(run, "fault")
    flags = [c for c in verdicts(run) if c["verdict"] == "flag"]
    assert len(faults) == 18  # per microbatch: 3 forward mm, 6 backward (input and weight gradients)
    key = ("step", "microbatch", "site", "phase")
    assert [tuple(c[k] for k in key) for c in flags] == [
        (f.step,) + tuple(f.fields[k] for k in key[1:]) for f in faults
    ]
    assert all(c["residual"] > 1000 * c["bound"] for c in flags)


@pytest.mark.slow
def test_abft_cannot_see_faults_in_softmax_or_normalisation(run_factory) -> None:
    run = run_factory("faulty", fault_profile=load_profile("softmax-norm"), abft=True)
    faults = events(run, "fault")
    ops = {f.fields["op"] for f in faults}
    assert any("softmax" in op for op in ops) and any(f.fields["site"].endswith("norm") for f in faults)
    checks = verdicts(run)
    assert checks and all(c["verdict"] == "ok" for c in checks)


def test_a_user_model_with_biased_linears_is_checked_through_the_emulator(write_profile) -> None:
    """Emulator entered first, checker second: the checker sees (and flags) the corrupted addmm."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    profile = write_profile(
        '[[fault]]\nops = ["addmm"]\nsites = "2"\nphases = ["forward"]\nkind = "stuck"\nvalue = 1e4\n'
    )
    log: list[tuple[str, dict]] = []
    hooks = {"clock": lambda: (0, 0), "sink": lambda kind, fields: log.append((kind, fields))}
    with FaultEmulator(profile, model, **hooks), AbftChecker(model, **hooks, sites=("0", "2")):
        model(x).sum().backward()
    checks = [(f["op"], f["phase"], f["site"], f["verdict"]) for kind, f in log if kind == "abft"]
    assert checks[:2] == [("aten.addmm.default", "forward", "0", "ok"), ("aten.addmm.default", "forward", "2", "flag")]
    assert {c[1] for c in checks[2:]} == {"backward"} and {c[3] for c in checks[2:]} == {"ok"}
    assert [kind for kind, _ in log].count("fault") == 1
