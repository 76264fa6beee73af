"""Corruption kinds: what a faulty unit does to the values it returns.

Pure functions of the selected values (a 1-D tensor); the emulator picks the
elements and the random draws. Bit flips work on the IEEE layout of the tensor's
own dtype (viewed as a same-width integer), so a bfloat16 exponent flip is the
flip a bfloat16 datapath would suffer, not a float32 one rounded back.
"""

from __future__ import annotations

import torch

# dtype -> (total bits, exponent bits, mantissa bits, same-width integer dtype)
LAYOUTS: dict[torch.dtype, tuple[int, int, int, torch.dtype]] = {
    torch.float64: (64, 11, 52, torch.int64),
    torch.float32: (32, 8, 23, torch.int32),
    torch.bfloat16: (16, 8, 7, torch.int16),
    torch.float16: (16, 5, 10, torch.int16),
}

FIELDS = ("sign", "exponent", "mantissa", "random")


def field_bits(dtype: torch.dtype, field: str) -> range:
    """Bit indices (0 = least significant) of ``field`` in ``dtype``'s layout."""
    width, exponent, mantissa, _ = LAYOUTS[dtype]
    return {
        "sign": range(width - 1, width),
        "exponent": range(mantissa, mantissa + exponent),
        "mantissa": range(0, mantissa),
        "random": range(0, width),
    }[field]


def flip_bits(values: torch.Tensor, bits: list[int]) -> torch.Tensor:
    """Flip bit ``bits[i]`` of ``values[i]``; returns a new tensor of the same dtype."""
    width, _, _, int_dtype = LAYOUTS[values.dtype]
    assert len(bits) == values.numel(), f"{len(bits)} bits for {values.numel()} values"
    # The top bit's mask is negative in a signed integer of the same width.
    masks = [(1 << b) - (1 << width if b == width - 1 else 0) for b in bits]
    mask = torch.tensor(masks, dtype=int_dtype, device=values.device)
    return (values.reshape(-1).view(int_dtype) ^ mask).view(values.dtype)


def flip_bit_sets(values: torch.Tensor, bit_sets: list[list[int]]) -> torch.Tensor:
    """Flip every bit of ``bit_sets[i]`` in ``values[i]`` (a multi-bit flip); returns a new tensor of the same dtype."""
    width, _, _, int_dtype = LAYOUTS[values.dtype]
    assert len(bit_sets) == values.numel(), f"{len(bit_sets)} bit sets for {values.numel()} values"
    masks = [sum((1 << b) - (1 << width if b == width - 1 else 0) for b in set(bits)) for bits in bit_sets]
    mask = torch.tensor(masks, dtype=int_dtype, device=values.device)
    return (values.reshape(-1).view(int_dtype) ^ mask).view(values.dtype)


def scale(values: torch.Tensor, factor: float) -> torch.Tensor:
    """Multiply by ``factor`` (rounded to the values' dtype, as a faulty multiplier would)."""
    return values * factor


def stuck(values: torch.Tensor, value: float) -> torch.Tensor:
    """Replace every value by ``value`` (a stuck-at register or lane)."""
    return torch.full_like(values, value)
