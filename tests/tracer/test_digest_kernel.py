"""The fused CPU kernel, the per-tensor torch ops and the batched torch ops give the same fingerprint bits, and
stats equal to rounding, on every dtype, shape, view and stride; without the kernel, the torch ops run and say so."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from tracer import fingerprint as fp
from tracer import kernel
from tracer.errors import TraceWarning


@pytest.fixture(scope="module")
def fused():
    """The built kernel: `make venv` builds it, and this builds it where that has not run."""
    kernel.build(kernel.DIGEST)
    module = kernel.load(kernel.DIGEST)
    assert module is not None, f"built the kernel but found no library in {kernel.build_dir(kernel.DIGEST)}"
    return module


def _cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    base = torch.randn(33, 65, generator=g)
    out = []
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        b = base.to(dtype)
        out += [
            b,
            b.t(),
            b[::2, 1::3],
            b[5:9],
            b[3:4, 7:],
            b.unsqueeze(0).expand(2, 33, 65),
            b.reshape(-1)[1:],
            b.reshape(-1)[:7],
            b[:0],
        ]
    for dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        ints = torch.randint(-100, 100, (17, 3), generator=g).to(dtype)
        out += [ints, ints.t(), ints[1::2]]
    flags = torch.randint(0, 2, (13,), generator=g).bool()
    out += [flags, flags[1:], torch.tensor(3.5), torch.empty(0, 4)]
    big = torch.randn(2 * fp.CHUNK + 5, generator=g)
    out += [big, big[1:], big.to(torch.bfloat16)[3:]]
    special = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0, float("nan")])
    out += [special, special.half(), special[2:4]]
    # Non-finite values inside the vector loops (not only the tail), in blocks before and after finite ones.
    holes = torch.randn(3 * 2048 + 50, generator=g)
    holes[[3, 17, 2050, 2051, 6150]] = torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan"), 1e38])
    out += [holes, holes.double(), holes.half(), holes[1:], torch.randn(3000, generator=g).double() * 1e300]
    return out


def _same(a: fp.TensorDigest, b: fp.TensorDigest, rel: float) -> None:
    assert a.fingerprint == b.fingerprint and a.meta == b.meta and (a.nan, a.inf) == (b.nan, b.inf)
    for x, y in ((a.l2, b.l2), (a.absmax, b.absmax)):
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=rel, abs=1e-30), (a, b)


def _exact_l2(t: torch.Tensor) -> float:
    """The L2 norm accumulated in float64, which the kernel and the batched ops both do."""
    return float(torch.linalg.vector_norm(t.double())) if t.numel() else 0.0


def test_kernel_torch_and_batched_ops_agree(fused) -> None:
    cases = _cases()
    kernel = fp._fused_digests(fused, cases)
    batched_rows = fp.batched_parts(cases)
    for t, k, brow in zip(cases, kernel, batched_rows):
        ref = fp._torch_digest(t)  # float32 accumulation for 16-bit floats: agrees to ~1e-4
        exact = dataclasses.replace(ref, l2=_exact_l2(t))
        _same(ref, exact, rel=1e-4)
        _same(k, exact, rel=1e-10)
        _same(fp.PendingDigest(brow, *fp.tensor_meta(t)).resolve(brow), exact, rel=1e-10)


def test_the_tracers_held_digests_equal_the_general_ones(fused) -> None:
    held = fp.held_digesters()
    assert held is not None
    cases = _cases() + [torch.randn(3, 4, 5, 2), torch.randn(2, 3).requires_grad_()]
    taken = [t for t in cases if t.is_contiguous()]
    rows = [held.one(t) for t in cases]
    for t, row in zip(cases, rows):
        if not t.is_contiguous():
            assert row is None, t.shape  # a view goes the general way, which reads it through a buffer
    assert repr(held.many(taken)) == repr([row for row in rows if row is not None])  # repr: NaN equals NaN
    assert len(taken) > 30
    for t, row in zip(taken, held.many(taken)):
        d = fp.digest_many([t])[0]
        assert row[0] == d.fingerprint and row[1:3] == (d.nan, d.inf) and row[5] == d.meta
        for x, y in zip(row[3:5], (d.l2, d.absmax)):
            assert (math.isnan(x) and math.isnan(y)) or x == y
    past_tables = torch.randn(fp.CHUNK * (fp._TABLES.get(fp._CPU, 1)[1].numel() + 1))
    for odd in (torch.randn(4, dtype=torch.complex64), past_tables, torch.randn(4, 6).t()):  # dtype, length, view
        assert held.one(odd) is None
        assert held.many([taken[0], odd]) is None  # one it does not take: the caller digests them all as usual
    assert held.many([]) == []


def test_kernel_detects_every_bit_of_an_element_in_a_misaligned_view(fused) -> None:
    t = torch.randn(4097).to(torch.bfloat16)[1:]  # starts mid-word: the kernel reads it through its buffer
    base = fp.digest_many([t])[0].fingerprint
    for bit in range(16):
        f = t.clone()
        f.view(torch.int16)[2048] ^= torch.tensor(1 << bit if bit < 15 else -(1 << 15), dtype=torch.int16)
        assert fp.digest_many([f])[0].fingerprint != base, bit


def test_kernel_bits_do_not_depend_on_the_thread_count(fused) -> None:
    cases = [torch.randn(3 * fp.CHUNK + 17), torch.randn(5, fp.CHUNK // 3).double(), torch.randn(100)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [fp.digest_many(cases)]
        torch.set_num_threads(max(2, threads))
        many = [fp.digest_many(cases)]
    finally:
        torch.set_num_threads(threads)
    assert one == many  # every field, the float stats included


def test_batched_ops_split_into_groups_like_one_group(monkeypatch) -> None:
    cases = [torch.randn(n) for n in (5, 3000, 70, 1, 0, 999)]
    whole = fp.batched_parts(cases)
    monkeypatch.setattr(fp, "_GROUP_WORDS", 1000)
    assert torch.equal(fp.batched_parts(cases)[:, [0, 4, 5]], whole[:, [0, 4, 5]])


def test_without_the_kernel_torch_ops_run_and_say_so_once(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(kernel.DIR_ENV, str(tmp_path / "nothing-built-here"))
    monkeypatch.setattr(fp, "_fused_state", [])
    t = torch.randn(100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = fp.digest(t), fp.digest(t * 2)
    notes = [w for w in caught if issubclass(w.category, TraceWarning)]
    assert len(notes) == 1 and "python -m tracer.kernel" in str(notes[0].message)
    assert fp.digest_implementation() == "torch"
    assert first.fingerprint == fp._torch_digest(t).fingerprint and second.l2 == pytest.approx(2 * first.l2)


def test_the_environment_forces_torch_ops_without_a_warning(monkeypatch) -> None:
    monkeypatch.setenv(fp.DIGEST_ENV, "torch")
    monkeypatch.setattr(fp, "_fused_state", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fp.digest_implementation() == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the GPU path is the batched torch ops")
def test_cuda_digests_equal_the_cpu_kernel(fused) -> None:
    cases = [t for t in _cases() if t.numel()]
    on_gpu = fp.digest_many([t.cuda() for t in cases])
    for t, d in zip(cases, on_gpu):
        _same(d, fp.digest_many([t])[0], rel=1e-10)


class _Wrapped(torch.Tensor):
    """A tensor subclass that dispatches in Python and holds no storage of its own (as DTensor does)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> _Wrapped:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206 - torch's protocol
        def unwrap(x):  # noqa: ANN001, ANN202
            return x.inner if isinstance(x, _Wrapped) else x

        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def test_a_tensor_subclass_without_bytes_of_its_own_is_digested_through_its_dispatch_not_read_raw() -> None:
    x = torch.randn(64, 33)
    wrapped = _Wrapped(x)
    plain, *many = fp.digest_many([x, wrapped, x])
    for d in (fp.digest(wrapped), *many):  # the same bits; the stats by torch ops may differ in the last bits
        assert (d.fingerprint, d.nan, d.inf, d.absmax, d.meta) == (plain.fingerprint, 0, 0, plain.absmax, plain.meta)
        assert d.l2 == pytest.approx(plain.l2, rel=1e-6)
    held = fp.held_digesters()
    if held is not None:  # the hooks' fast path declines it, so the caller takes the general path above
        assert held.one(wrapped) is None and held.many([x, wrapped]) is None
