"""The ABFT checksum kernel (faults/abft_sums.cpp) and the torch ops give the same checks: every residual and bound
equal to float64 rounding, the same verdict and worst check, on every checked op form, dtype, stride and edge."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from faults import abft
from faults.abft_kernel import ABFT
from tracer import kernel
from tracer.errors import TraceWarning

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
SAFETY = 2.0


@pytest.fixture(scope="module")
def module():
    built = kernel.load(ABFT)
    if built is None:
        pytest.skip(f"the ABFT kernel is not built here ({kernel.build_dir(ABFT)}): `python -m faults.abft_kernel`")
    return built


@pytest.fixture
def with_kernel(module, monkeypatch):
    """check_matmul on the kernel, whatever the environment says."""
    monkeypatch.setattr(abft, "_kernel_state", [module])
    return module


def randn(dtype: torch.dtype, *shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values, stored column-major (as autograd hands over a transposed weight)."""
    return t.mT.contiguous().mT


def cases(dtype: torch.dtype) -> list[tuple[str, object, tuple, dict]]:
    """(name, op, args, kwargs) for every checked op form; inner dimension 96."""
    a, b = randn(dtype, 40, 96, seed=1), randn(dtype, 96, 24, seed=2)
    a3, b3 = randn(dtype, 3, 40, 96, seed=3), randn(dtype, 3, 96, 24, seed=4)
    vec, full, col = randn(dtype, 24, seed=5), randn(dtype, 40, 24, seed=6), randn(dtype, 40, 1, seed=7)
    full3 = randn(dtype, 3, 40, 24, seed=8)
    x3, w = randn(dtype, 2, 20, 96, seed=9), randn(dtype, 24, 96, seed=10)
    wide, wide3 = randn(dtype, 40, 200, seed=11), randn(dtype, 2, 20, 128, seed=12)
    big, big3 = randn(dtype, 512, 256, seed=13), randn(dtype, 2, 300, 256, seed=14)
    scaled = {"alpha": 2.0, "beta": -0.5}
    return [
        ("mm large", aten.mm.default, (big, transposed(randn(dtype, 256, 64, seed=15))), {}),
        ("baddbmm large", aten.baddbmm.default, (vec[:7], big3, randn(dtype, 2, 256, 7, seed=16)), scaled),
        ("mm", aten.mm.default, (a, b), {}),
        ("mm A^T", aten.mm.default, (transposed(a), b), {}),
        ("mm B^T", aten.mm.default, (a, transposed(b)), {}),
        ("mm A^T B^T", aten.mm.default, (transposed(a), transposed(b)), {}),
        ("mm strided", aten.mm.default, (wide[::2, 3:195:2], b[:, ::1]), {}),
        ("mm odd sizes", aten.mm.default, (a[:7, :5], b[:5, :3]), {}),
        ("addmm vector", aten.addmm.default, (vec, a, b), {}),
        ("addmm full", aten.addmm.default, (full, transposed(a), b), scaled),
        ("addmm column", aten.addmm.default, (col, a, transposed(b)), {"beta": 1.5}),
        ("addmm scalar", aten.addmm.default, (vec[0], a, b), {"alpha": -1.0}),
        ("addmm beta 0", aten.addmm.default, (full, a, b), {"beta": 0.0}),
        ("addmm expanded", aten.addmm.default, (vec.expand(40, 24), a, b), scaled),
        ("bmm", aten.bmm.default, (a3, b3), {}),
        ("bmm transposed", aten.bmm.default, (transposed(a3), transposed(b3)), {}),
        ("baddbmm full", aten.baddbmm.default, (full3, a3, b3), scaled),
        ("baddbmm vector", aten.baddbmm.default, (vec, transposed(a3), b3), {"beta": 0.25}),
        ("linear", aten.linear.default, (a, w), {}),
        ("linear bias", aten.linear.default, (a, w, vec), {}),
        ("linear 3-D", aten.linear.default, (x3, w, vec), {}),
        ("linear 3-D strided", aten.linear.default, (wide3[..., 5:101], transposed(w)), {}),
        ("linear 1-D", aten.linear.default, (a[0], w, vec), {}),
    ]


def empty_cases(dtype: torch.dtype) -> list[tuple[str, object, tuple, dict]]:
    return [
        ("k = 0", aten.mm.default, (randn(dtype, 5, 0, seed=1), randn(dtype, 0, 7, seed=2)), {}),
        (
            "k = 0 bias",
            aten.addmm.default,
            (randn(dtype, 7, seed=3), randn(dtype, 5, 0, seed=1), randn(dtype, 0, 7, seed=2)),
            {"beta": 2.0},
        ),
        ("m = 0", aten.mm.default, (randn(dtype, 0, 6, seed=1), randn(dtype, 6, 7, seed=2)), {}),
        ("m = n = 0", aten.mm.default, (randn(dtype, 0, 6, seed=1), randn(dtype, 6, 0, seed=2)), {}),
        ("batch 0", aten.bmm.default, (randn(dtype, 0, 4, 6, seed=1), randn(dtype, 0, 6, 3, seed=2)), {}),
    ]


def run(op, args: tuple, kwargs: dict) -> torch.Tensor:  # noqa: ANN001
    return op(*args, **kwargs)


def scale_of(op, args: tuple, out: torch.Tensor) -> float:  # noqa: ANN001
    """safety * theta(k): the bound per unit of magnitude."""
    k = args[1].shape[-1] if op.overloadpacket is aten.linear else abft._operands(op, args, {})[0].shape[-1]
    return SAFETY * abft.error_factor(k, out.dtype, out.device)


def assert_same_checks(module, op, args: tuple, kwargs: dict, out: torch.Tensor, name: str) -> None:  # noqa: ANN001
    """Every residual and bound agrees; float64 sums in another order differ by far less than the slack."""
    a, b, d, alpha, beta = abft._kernel_operands(op.overloadpacket, args, kwargs)
    scale = scale_of(op, args, out)
    got = module.residuals(a, b, out, d, alpha, beta, scale, op.overloadpacket is aten.linear)
    assert got is not None, f"{name}: the kernel refused operands it should read"
    residual, bound = got
    again = module.residuals(a, b, out, d, alpha, beta, scale, op.overloadpacket is aten.linear)
    for x, y in zip((residual, bound), again):
        assert torch.allclose(x, y, rtol=0, atol=0, equal_nan=True), f"{name}: not deterministic"
    ref_residual, ref_bound, _ = abft.torch_residuals(op, args, kwargs, out, SAFETY)
    assert residual.shape == ref_residual.shape, name
    assert torch.equal(residual.isnan(), ref_residual.isnan()) and torch.equal(bound.isnan(), ref_bound.isnan()), name
    assert torch.equal(bound.isinf(), ref_bound.isinf()), name
    assert torch.allclose(bound, ref_bound, rtol=1e-12, atol=0, equal_nan=True), name
    finite = ref_bound.isfinite() & ref_residual.isfinite()
    slack = 1e-12 * ref_bound[finite] / scale + 1e-300  # of the magnitude checksum
    assert ((residual[finite] - ref_residual[finite]).abs() <= slack).all(), name
    assert torch.equal(residual[~finite], ref_residual[~finite]) or residual[~finite].isnan().all(), name


def score(r: abft.AbftResult) -> float:
    if r.flagged and not r.residual <= r.bound:
        return math.inf
    return r.residual / r.bound if r.bound > 0 else 0.0


def assert_same_verdict(op, args: tuple, kwargs: dict, out: torch.Tensor, name: str) -> abft.AbftResult:  # noqa: ANN001
    got, ref = abft.check_matmul(op, args, kwargs, out, SAFETY), abft.torch_check(op, args, kwargs, out, SAFETY)
    assert got.shape == ref.shape and got.flagged == ref.flagged, (name, got, ref)
    if math.isnan(ref.residual) or math.isnan(ref.bound) or math.isinf(ref.bound):
        assert (got.residual, got.bound) == pytest.approx((ref.residual, ref.bound), nan_ok=True), (name, got, ref)
    else:  # the same worst score, to the residuals' slack: rounding may pick another row or column among equals
        slack = 1e-12 / scale_of(op, args, out)
        assert score(got) == pytest.approx(score(ref), rel=1e-9, abs=slack), (name, got, ref)
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_and_torch_ops_give_the_same_checks(module, with_kernel, dtype: torch.dtype) -> None:
    for name, op, args, kwargs in cases(dtype) + empty_cases(dtype):
        out = run(op, args, kwargs)
        assert_same_checks(module, op, args, kwargs, out, name)
        clean = assert_same_verdict(op, args, kwargs, out, name)
        assert not clean.flagged, (name, clean)
        if out.numel() == 0:
            continue
        bad = out.clone()
        bad.view(-1)[out.numel() // 3] += 64 * out.abs().max().clamp(min=1)
        assert_same_checks(module, op, args, kwargs, bad, name)
        assert assert_same_verdict(op, args, kwargs, bad, name).flagged, name


def test_checks_do_not_depend_on_the_thread_count(module, with_kernel) -> None:
    threads = torch.get_num_threads()
    large = [c for c in cases(torch.float32) if c[0].endswith("large")]
    assert len(large) == 2

    def every_check() -> list[tuple[torch.Tensor, torch.Tensor]]:
        got = []
        for _, op, args, kwargs in large:
            a, b, d, alpha, beta = abft._kernel_operands(op.overloadpacket, args, kwargs)
            got.append(module.residuals(a, b, run(op, args, kwargs), d, alpha, beta, 1e-6, False))
        return got

    try:
        torch.set_num_threads(1)
        one = every_check()
        torch.set_num_threads(max(2, threads))
        many = every_check()
    finally:
        torch.set_num_threads(threads)
    for (r1, b1), (r2, b2) in zip(one, many):
        assert torch.equal(r1, r2) and torch.equal(b1, b2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_finite_values_give_the_same_verdicts(module, with_kernel, dtype: torch.dtype) -> None:
    """An infinity or NaN in an input makes its rows and columns vacuous (never flagged); one in the result alone,
    from finite inputs, is a fault; an infinite product of zeros is NaN in both."""
    inf, nan = math.inf, math.nan
    for name, op, args, kwargs in cases(dtype):
        out = run(op, args, kwargs)
        for where, value in (("A", inf), ("A", nan), ("B", -inf), ("D", inf), ("C", nan), ("C", inf)):
            tensors = list(args)
            position = {"A": 0 if op.overloadpacket in (aten.mm, aten.bmm, aten.linear) else 1}
            position["B"] = position["A"] + 1
            position["D"] = 2 if op.overloadpacket is aten.linear else 0
            if where == "D" and (len(tensors) < 3 or kwargs.get("beta", 1) == 0):
                continue
            if where == "C":
                result = out.clone()
                result.view(-1)[1] = value
            else:
                t = tensors[position[where]].clone()  # same strides
                t[(0,) * t.dim()] = value
                if where == "B":  # and a zero column of A meets it: inf * 0
                    a = tensors[position["A"]].clone()
                    a[..., 0] = 0
                    tensors[position["A"]] = a
                tensors[position[where]] = t
                result = run(op, tuple(tensors), kwargs)
            label = f"{name}, {value} in {where}"
            assert_same_checks(module, op, tuple(tensors), kwargs, result, label)
            verdict = assert_same_verdict(op, tuple(tensors), kwargs, result, label)
            assert verdict.flagged == (where == "C"), (label, verdict)


def test_operands_it_does_not_read_fall_back_to_torch_ops(module, with_kernel) -> None:
    a, b = randn(torch.float32, 6, 5, seed=1), randn(torch.float32, 5, 4, seed=2)
    out = a @ b
    assert module.check(a, b.double(), out, None, 1.0, 1.0, 1e-6, False) is None  # mixed dtypes
    assert module.check(a.int(), b.int(), out.int(), None, 1.0, 1.0, 1e-6, False) is None  # no model for ints
    with FakeTensorMode():  # CPU tensors without bytes to read
        fake_a, fake_b = torch.empty(6, 5), torch.empty(5, 4)
        fake_out = fake_a @ fake_b
    assert module.check(fake_a, fake_b, fake_out, None, 1.0, 1.0, 1e-6, False) is None
    x = randn(torch.float32, 4, 3, 8, seed=3)[:, :2].transpose(0, 1)  # leading dimensions that do not fold
    w = randn(torch.float32, 5, 8, seed=4)
    assert module.check(x, w, F.linear(x, w), None, 1.0, 1.0, 1e-6, True) is None
    assert_same_verdict(aten.linear.default, (x, w), {}, F.linear(x, w), "unfoldable linear")


def test_without_the_kernel_torch_ops_run_and_say_so_once(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(kernel.DIR_ENV, str(tmp_path / "nothing-built-here"))
    monkeypatch.setattr(abft, "_kernel_state", [])
    a, b = randn(torch.float32, 6, 5, seed=1), randn(torch.float32, 5, 4, seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = abft.check_matmul(aten.mm.default, (a, b), {}, a @ b)
        second = abft.check_matmul(aten.mm.default, (a, b), {}, (a @ b) * 2)
    notes = [w for w in caught if issubclass(w.category, TraceWarning)]
    assert len(notes) == 1 and "python -m faults.abft_kernel" in str(notes[0].message)
    assert abft.abft_implementation() == "torch"
    assert first == abft.torch_check(aten.mm.default, (a, b), {}, a @ b) and second.flagged


def test_the_environment_forces_torch_ops_without_a_warning(monkeypatch) -> None:
    monkeypatch.setenv(abft.ABFT_ENV, "torch")
    monkeypatch.setattr(abft, "_kernel_state", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert abft.abft_implementation() == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: there the check is torch ops")
def test_cuda_checks_agree_with_the_cpu_kernel(with_kernel) -> None:
    for name, op, args, kwargs in cases(torch.float64):
        out = run(op, args, kwargs)
        on_gpu = abft.check_matmul(
            op, tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), kwargs, out.cuda()
        )
        on_cpu = abft.check_matmul(op, args, kwargs, out)
        assert on_gpu.flagged == on_cpu.flagged and score(on_gpu) == pytest.approx(score(on_cpu), rel=1e-6), name
