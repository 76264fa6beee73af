"""The defect signature of a corrupted tensor: which bits flipped, how far in ulps, and the pattern of the elements.

    sig = defect_signature(golden, suspect, op="aten.mm.default", step=3, site="layers.1.feed_forward")
    sig.fields            # {"sign": 0, "exponent": 1, "mantissa": 0}: elements with a flip in each field
    sig.bits              # {27: 1}: how many elements had bit 27 flipped (0 = least significant)
    sig.period            # 32 when every 32nd element is hit (the gcd of the gaps between hit positions)
    sig.to_json()         # what an incident's manifest holds and `sdc incident` prints (`describe`)

Pure torch (with faults.corrupt's `LAYOUTS`), on any floating dtype of faults.corrupt's layouts (float64, float32,
bfloat16, float16). Bits are compared in the dtype's own IEEE layout; ulps are the distance between the two values'
positions in the ordered sequence of that dtype's floats (sign-magnitude mapped onto integers), so one exponent-bit flip
is a huge distance and a last-mantissa-bit flip is 1. Warp- and tile-periodic errors, typical of real SDC, show as a
period.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from faults.corrupt import LAYOUTS
from tracer.errors import ValidationError
from tracer.float_bits import ordered

SHOWN = 16  # positions a signature lists


@dataclass(frozen=True)
class Signature:
    """How ``suspect`` differs from ``golden``, bit by bit and element by element."""

    dtype: str
    shape: tuple[int, ...]
    shape_class: str  # the shape with each dimension rounded up to a power of two: similar tensors group together
    elements: int
    differing: int  # elements whose bits differ
    fields: dict[str, int]  # elements with at least one flipped bit in the sign, exponent, mantissa
    bits: dict[int, int]  # bit index -> elements with that bit flipped
    ulps_max: float
    ulps_median: float
    positions: tuple[int, ...]  # the first differing flat indices
    coordinates: tuple[tuple[int, ...], ...]  # the same as indices into the shape
    period: int | None  # gcd of the gaps between differing positions (None with fewer than two)
    offset: int | None  # the first position modulo the period
    op: str | None = None
    step: int | None = None
    site: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "shape_class": self.shape_class,
            "elements": self.elements,
            "differing": self.differing,
            "fields": self.fields,
            "bits": {str(b): n for b, n in sorted(self.bits.items())},
            "ulps_max": self.ulps_max,
            "ulps_median": self.ulps_median,
            "positions": list(self.positions),
            "coordinates": [list(c) for c in self.coordinates],
            "period": self.period,
            "offset": self.offset,
            "op": self.op,
            "step": self.step,
            "site": self.site,
            **self.extra,
        }

    def describe(self) -> str:
        """A few lines for a person."""
        return describe_json(self.to_json())


def describe_json(sig: dict[str, Any]) -> str:
    """A few lines for a person, from a signature's JSON form (as a manifest holds it)."""
    shape = f"{sig['dtype']}{sig['shape']}"
    if not sig["differing"]:
        return f"{shape}: no bit differs"
    fields = ", ".join(f"{n} {name}" for name, n in sig["fields"].items() if n)
    bits = ", ".join(f"bit {b} x{n}" for b, n in sorted(sig["bits"].items(), key=lambda x: -int(x[0]))[:8])
    where = f" at step {sig['step']}" if sig.get("step") is not None else ""
    where += f" in {sig['site']}" if sig.get("site") else ""
    where += f" ({sig['op']})" if sig.get("op") else ""
    period = f", period {sig['period']} (offset {sig['offset']})" if sig.get("period") else ""
    return (
        f"{sig['differing']} of {sig['elements']} elements of {shape} differ{where}\n"
        f"  flipped: {fields}; {bits}\n"
        f"  ulps: max {sig['ulps_max']:.6g}, median {sig['ulps_median']:.6g}{period}\n"
        f"  first positions: {sig['positions'][:8]}"
    )


def defect_signature(
    golden: torch.Tensor,
    suspect: torch.Tensor,
    *,
    op: str | None = None,
    step: int | None = None,
    site: str | None = None,
) -> Signature:
    """The signature of ``suspect`` against ``golden`` (same shape and floating dtype)."""
    if golden.shape != suspect.shape or golden.dtype != suspect.dtype:
        raise ValidationError(
            f"a defect signature compares tensors of one shape and dtype, not "
            f"{golden.dtype}{list(golden.shape)} and {suspect.dtype}{list(suspect.shape)}"
        )
    if golden.dtype not in LAYOUTS:
        raise ValidationError(
            f"a defect signature reads floating tensors ({', '.join(map(str, LAYOUTS))}), not {golden.dtype}"
        )
    width, exponent, mantissa, int_dtype = LAYOUTS[golden.dtype]
    g = golden.detach().cpu().contiguous().reshape(-1).view(int_dtype)
    s = suspect.detach().cpu().contiguous().reshape(-1).view(int_dtype)
    xor = (g ^ s).to(torch.int64)
    hit = torch.nonzero(xor).reshape(-1)
    flips = xor[hit]
    bits: dict[int, int] = {}
    for b in range(width):
        n = int(((flips >> b) & 1).sum())
        if n:
            bits[b] = n
    ranges = {"sign": (width - 1, 1), "exponent": (mantissa, exponent), "mantissa": (0, mantissa)}
    fields = {name: int((((flips >> low) & _mask(0, n)) != 0).sum()) for name, (low, n) in ranges.items()}
    ulps = (ordered(g[hit], width) - ordered(s[hit], width)).abs()
    positions = [int(p) for p in hit[:SHOWN]]
    period = offset = None
    if hit.numel() >= 2:
        period = math.gcd(*(int(d) for d in hit[1:] - hit[:-1]))
        offset = int(hit[0]) % period
    coordinates = (
        tuple(tuple(int(c) for c in coord) for coord in zip(*torch.unravel_index(hit[:SHOWN], golden.shape)))
        if golden.dim()
        else tuple(() for _ in positions)
    )
    return Signature(
        dtype=str(golden.dtype).removeprefix("torch."),
        shape=tuple(golden.shape),
        shape_class=shape_class(golden.shape),
        elements=golden.numel(),
        differing=int(hit.numel()),
        fields=fields,
        bits=bits,
        ulps_max=float(ulps.max()) if ulps.numel() else 0.0,
        ulps_median=float(ulps.median()) if ulps.numel() else 0.0,
        positions=tuple(positions),
        coordinates=coordinates,
        period=period,
        offset=offset,
        op=op,
        step=step,
        site=site,
    )


def shape_class(shape: tuple[int, ...] | torch.Size) -> str:
    """``[3, 100]`` -> ``"4x128"``: each dimension rounded up to a power of two."""
    return "x".join(str(1 << max(0, (d - 1).bit_length())) if d else "0" for d in shape) or "scalar"


def _mask(low: int, high: int) -> int:
    return sum(1 << b for b in range(low, high))
