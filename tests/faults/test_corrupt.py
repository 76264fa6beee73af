"""Corruption kinds on the IEEE layouts of float64, float32, bfloat16 and float16."""

from __future__ import annotations

import pytest
import torch

from faults.corrupt import LAYOUTS, field_bits, flip_bits, scale, stuck

DTYPES = list(LAYOUTS)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sign_flip_negates(dtype: torch.dtype) -> None:
    v = torch.tensor([1.5, -2.0, 0.0, 3.25], dtype=dtype)
    (sign,) = field_bits(dtype, "sign")
    flipped = flip_bits(v, [sign] * 4)
    assert torch.equal(flipped, -v) and torch.signbit(flipped[2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_exponent_flip_scales_by_a_power_of_two(dtype: torch.dtype) -> None:
    _, exponent_bits, mantissa_bits, _ = LAYOUTS[dtype]
    bits = field_bits(dtype, "exponent")
    assert list(bits) == list(range(mantissa_bits, mantissa_bits + exponent_bits))
    one = torch.ones(1, dtype=dtype)
    for j, bit in enumerate(bits[:-1]):  # the top bit of 1.0's biased exponent is 0 -> inf/huge
        # 1.0 has biased exponent 0b0111...1: flipping exponent bit j clears it, dividing by 2^(2^j).
        assert flip_bits(one, [bit]).double().item() == 2.0 ** -(2**j)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_mantissa_flip_changes_less_than_the_value(dtype: torch.dtype) -> None:
    v = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(dtype) + 3
    for bit in field_bits(dtype, "mantissa"):
        rel = ((flip_bits(v, [bit] * 64).double() - v.double()) / v.double()).abs()
        assert (rel > 0).all() and (rel < 1).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_flipping_the_same_bits_twice_restores_every_bit(dtype: torch.dtype) -> None:
    v = torch.randn(100, generator=torch.Generator().manual_seed(1)).to(dtype)
    bits = [i % LAYOUTS[dtype][0] for i in range(100)]
    once = flip_bits(v, bits)
    assert not torch.equal(once, v) and torch.equal(flip_bits(once, bits), v)


def test_scale_and_stuck_keep_the_dtype() -> None:
    v = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    assert torch.equal(scale(v, 256.0), torch.tensor([256.0, -512.0], dtype=torch.bfloat16))
    assert torch.equal(stuck(v, 0.0), torch.zeros(2, dtype=torch.bfloat16))
