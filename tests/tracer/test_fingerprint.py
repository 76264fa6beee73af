"""The fingerprint is bit-exact, position-aware and matches its written definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracer import fingerprint as fp
from tracer.fingerprint import CHUNK, digest, fingerprint

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference_lane_sum(t: torch.Tensor) -> int:
    """The docstring's definition, written independently with numpy uint64 arithmetic."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    raw += b"\0" * (-len(raw) % 4)
    x = np.frombuffer(raw, dtype="<i4").astype(np.int64).view(np.uint64)
    w = fp._odd_table(fp._W_SEED, CHUNK).numpy().view(np.uint64)
    total = 0
    for c in range(max(1, -(-x.size // CHUNK))):
        part = x[c * CHUNK : (c + 1) * CHUNK]
        with np.errstate(over="ignore"):
            s = int((part * w[: part.size]).sum(dtype=np.uint64))
        r = 1 if c == 0 else int(fp._odd_table(fp._R_SEED, 1, c)[0]) & fp._MASK64
        total = (total + s * r) & fp._MASK64
    return total


def test_weight_tables_are_splitmix64_as_written() -> None:
    """The tables are computed with wrapping torch ops; here with Python integers, one by one."""

    def splitmix(seed: int, n: int, offset: int = 0) -> list[int]:
        return [fp.mix64(seed + (offset + i + 1) * 0x9E3779B97F4A7C15) | 1 for i in range(n)]

    w = fp._odd_table(fp._W_SEED, CHUNK).numpy().view(np.uint64)
    assert [int(v) for v in w] == splitmix(fp._W_SEED, CHUNK)
    r = fp._odd_table(fp._R_SEED, 300, 41).numpy().view(np.uint64)
    assert [int(v) for v in r] == splitmix(fp._R_SEED, 300, 41)


def test_fingerprints_of_logs_already_written_do_not_change() -> None:
    """Pinned values (lanes64-v1): a change here makes every recorded log disagree with a new recording."""
    assert fingerprint(torch.arange(1000, dtype=torch.float32)) == 0x866BEF551F1B39D
    assert fingerprint(torch.arange(3 * CHUNK + 7, dtype=torch.float32).to(torch.bfloat16)) == 0xC8AFF8586976F040


@pytest.mark.parametrize("numel", [1, 3, 1000, CHUNK - 1, 2 * CHUNK + 5])
def test_matches_reference_definition(numel: int) -> None:
    g = torch.Generator().manual_seed(numel)
    for dtype in DTYPES:
        t = torch.randn(numel, generator=g).to(dtype)
        expected = fp._finalise(reference_lane_sum(t), fp.tensor_meta(t)[1])
        assert fingerprint(t) == expected, (dtype, numel)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_single_bit_flip_changes_the_fingerprint(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    t = torch.randn(64, 257, generator=g).to(dtype)
    base = fingerprint(t)
    bits = t.element_size() * 8
    as_int = {2: torch.int16, 4: torch.int32}[t.element_size()]
    positions = torch.randint(0, t.numel(), (400,), generator=g)
    bit_idx = torch.randint(0, bits, (400,), generator=g)
    for pos, bit in zip(positions.tolist(), bit_idx.tolist()):
        flipped = t.clone().reshape(-1)
        words = flipped.view(as_int)
        words[pos] ^= torch.tensor(1 << bit if bit < bits - 1 else -(1 << bit), dtype=as_int)
        assert fingerprint(flipped.reshape(t.shape)) != base, (pos, bit)


def test_every_bit_of_one_element_across_chunks() -> None:
    t = torch.randn(2 * CHUNK + 11)
    base = fingerprint(t)
    for pos in (CHUNK - 1, CHUNK, t.numel() - 1):
        for bit in range(32):
            f = t.clone()
            f.view(torch.int32)[pos] ^= torch.tensor(1 << bit if bit < 31 else -(1 << 31), dtype=torch.int32)
            assert fingerprint(f) != base, (pos, bit)


@pytest.mark.parametrize("dtype", DTYPES)
def test_views_and_non_contiguous_tensors(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(33, 65, generator=g).to(dtype)
    for view in (base.t(), base[::2, 1::3], base[5:9], base.unsqueeze(0).expand(2, 33, 65)):
        assert fingerprint(view) == fingerprint(view.contiguous())
        pos = int(torch.randint(0, view.numel(), (1,), generator=g))
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(pos), view.shape))
        bumped = view.clone()
        bumped[idx] = -bumped[idx] if bumped[idx] != 0 else 1
        assert fingerprint(bumped) != fingerprint(view), idx


def test_permutations_and_xor_cancelling_pairs_change_it() -> None:
    g = torch.Generator().manual_seed(11)
    t = torch.randn(4096, generator=g)
    base = fingerprint(t)
    for _ in range(200):
        i, j = torch.randint(0, t.numel(), (2,), generator=g).tolist()
        if t[i] == t[j]:
            continue
        swapped = t.clone()
        swapped[[i, j]] = swapped[[j, i]]
        assert fingerprint(swapped) != base, ("swap", i, j)
        # The same bit flipped in two words cancels in any XOR reduction.
        bit = int(torch.randint(0, 32, (1,), generator=g))
        pair = t.clone()
        mask = torch.tensor(1 << bit if bit < 31 else -(1 << 31), dtype=torch.int32)
        pair.view(torch.int32)[i] ^= mask
        pair.view(torch.int32)[j] ^= mask
        assert fingerprint(pair) != base, ("xor pair", i, j, bit)
    assert fingerprint(t.flip(0)) != base
    assert fingerprint(t.roll(1)) != base


def test_dtype_and_shape_are_part_of_the_identity() -> None:
    t = torch.zeros(8, 8)
    assert fingerprint(t) != fingerprint(t.reshape(64))
    assert fingerprint(t) != fingerprint(t.view(torch.int32))
    assert fingerprint(torch.zeros(2, dtype=torch.float16)) != fingerprint(torch.zeros(1, dtype=torch.float32))


def test_stats_ride_along() -> None:
    t = torch.tensor([3.0, -4.0, 0.0])
    d = digest(t)
    assert (d.l2, d.absmax, d.nan, d.inf, d.meta) == (5.0, 4.0, 0, 0, "float32[3]")
    assert d.fingerprint == fingerprint(t)
    bad = digest(torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), float("nan")]))
    assert (bad.nan, bad.inf) == (2, 2)
    half = digest(torch.full((1000,), 2.0, dtype=torch.bfloat16))
    assert half.l2 == pytest.approx(2.0 * 1000**0.5, rel=1e-3) and half.absmax == 2.0
    ints = digest(torch.tensor([[1, -7], [2, 3]]))
    assert ints.absmax == 7.0 and ints.meta == "int64[2,2]"
    empty = digest(torch.empty(0, 4))
    assert empty.meta == "float32[0,4]" and empty.l2 == 0.0


def test_odd_byte_lengths_and_bool() -> None:
    odd = torch.randn(7).to(torch.bfloat16)
    assert fingerprint(odd) != fingerprint(odd[:6])
    flags = torch.tensor([True, False, True])
    other = flags.clone()
    other[1] = True
    assert fingerprint(flags) != fingerprint(other)
    assert digest(flags).fingerprint == fingerprint(flags)
