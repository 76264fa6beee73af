"""Fingerprints computed on xla:0 equal the CPU's for the same bits, inside the graph."""

from __future__ import annotations

import time

import pytest
import torch

from tests.xla.conftest import SKIP_REASON, samples, xla_metrics

torch_xla = pytest.importorskip("torch_xla", reason=SKIP_REASON)

from tracer.fingerprint import CHUNK, digest, fingerprint, lazy_digest  # noqa: E402

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]
SHAPES = [(), (0,), (3,), (7, 5), (3, 1000, 7), (2 * CHUNK + 5,)]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).mul(1e3).to(dtype)
    return torch.randint(0, 250, shape, generator=g).to(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_digest_on_xla_equals_the_cpu_digest(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = sample(dtype, shape, seed=len(shape) * 31 + DTYPES.index(dtype))
    on_cpu, on_xla = digest(t), digest(t.to(torch_xla.device()))
    assert on_xla.fingerprint == on_cpu.fingerprint == fingerprint(t), (on_xla, on_cpu)
    assert (on_xla.meta, on_xla.absmax, on_xla.nan, on_xla.inf) == (on_cpu.meta, on_cpu.absmax, on_cpu.nan, on_cpu.inf)
    assert on_xla.l2 == pytest.approx(on_cpu.l2, rel=1e-4)  # float reductions may sum in another order


def test_views_and_non_finite_values_match_the_cpu() -> None:
    base = torch.randn(6, 9, generator=torch.Generator().manual_seed(3))
    base[1, 2], base[4, 4], base[0, 7] = float("nan"), float("inf"), -float("inf")
    for t in (base, base.to(torch.bfloat16)):  # converted here: XLA writes another NaN payload
        for view in (lambda x: x, lambda x: x.t(), lambda x: x[1:5, 2:8:3], lambda x: x[:, 1:]):
            on_cpu, on_xla = digest(view(t)), digest(view(t.to(torch_xla.device())))
            assert (on_xla.fingerprint, on_xla.meta, on_xla.nan, on_xla.inf) == (
                on_cpu.fingerprint,
                on_cpu.meta,
                on_cpu.nan,
                on_cpu.inf,
            )
            assert str(on_xla.absmax) == str(on_cpu.absmax)  # NaN where there is a NaN, as on the CPU
    assert (digest(base).nan, digest(base).inf) == (1, 2)


def test_every_single_bit_flip_changes_the_fingerprint_on_xla() -> None:
    t = sample(torch.bfloat16, (33, 17), seed=5)
    base = digest(t.to(torch_xla.device())).fingerprint
    words = t.reshape(-1).view(torch.int16)
    for pos in (0, 1, 100, t.numel() - 1):
        for bit in range(16):
            flipped = words.clone()
            flipped[pos] ^= torch.tensor(1 << bit if bit < 15 else -(1 << 15), dtype=torch.int16)
            changed = flipped.view(torch.bfloat16).reshape(t.shape).to(torch_xla.device())
            assert digest(changed).fingerprint != base, (pos, bit)


def settled(met, quiet_s: float = 0.5, within_s: float = 10.0) -> tuple[int, int]:  # noqa: ANN001
    """(graphs run, transfers from the device) once the device is idle and neither count has moved for ``quiet_s``:
    the runtime records a graph's time on its own thread, so on a loaded machine an earlier sync's record can land
    after the sync returned (CI saw the count move between two reads)."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
    deadline = time.monotonic() + within_s
    counts = samples(met, "ExecuteTime"), samples(met, "TransferFromDeviceTime")
    still_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - still_since < quiet_s:
        time.sleep(0.02)
        now = samples(met, "ExecuteTime"), samples(met, "TransferFromDeviceTime")
        if now != counts:
            counts, still_since = now, time.monotonic()
    return counts


def ran_graphs(met, expected: int, within_s: float = 10.0) -> int:  # noqa: ANN001 - torch_xla.debug.metrics
    """ExecuteTime's count once the device is idle: the runtime times a graph on its own thread, and on a loaded
    machine that record can land after ``sync(wait=True)`` returns (CI saw it one short). Waits for the device's
    operations, then up to ``within_s`` for the count to reach ``expected``; returns the count either way."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
    deadline = time.monotonic() + within_s
    while samples(met, "ExecuteTime") < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return samples(met, "ExecuteTime")


def test_a_lazy_digest_joins_the_graph_and_reads_nothing_until_the_step_mark() -> None:
    met = xla_metrics()
    met.clear_counters()  # forgets earlier fallbacks
    x = torch.randn(300, 41).to(torch_xla.device())
    torch_xla.sync(wait=True)
    before = settled(met)
    y = x * 3 + 1  # lazy: no graph has run yet
    pending = lazy_digest(y)
    assert (samples(met, "ExecuteTime"), samples(met, "TransferFromDeviceTime")) == before
    torch_xla.sync(wait=True)
    assert ran_graphs(met, before[0] + 1) == before[0] + 1
    resolved, on_cpu = pending.resolve(pending.parts.cpu()), digest(y.cpu())
    assert (resolved.fingerprint, resolved.absmax, resolved.meta) == (on_cpu.fingerprint, on_cpu.absmax, on_cpu.meta)
    assert not met.executed_fallback_ops(), "an op of the digest ran on the host, not in the graph"
