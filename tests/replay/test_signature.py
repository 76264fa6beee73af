"""The defect signature: flipped bits by field and index, ulps, positions and period, from real corrupted tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from faults import FaultEmulator, load_profile
from faults.corrupt import flip_bits
from replay.bundle_reproduce import classify
from replay.signature import defect_signature, describe_json, shape_class
from tracer.errors import ValidationError

EXPONENT_27 = """
description = "bit 27 (an exponent bit of float32) of one element of every matmul"
seed = 3
[[fault]]
ops = ["matmul"]
phases = ["forward"]
elements = 1
kind = "bitflip"
bits = 27
"""


def test_an_emulated_exponent_flip_names_its_bit(tmp_path: Path) -> None:
    (tmp_path / "flip.toml").write_text(EXPONENT_27, encoding="utf-8")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24))
    x = torch.randn(4, 16)
    golden = model(x).detach()
    faults: list[dict] = []
    with FaultEmulator(
        load_profile(tmp_path / "flip.toml"),
        model,
        clock=lambda: (0, 0),
        sink=lambda kind, fields: faults.append(fields),
        sites=("0",),
    ):
        suspect = model(x).detach()
    sig = defect_signature(golden, suspect, step=0, site="0")
    assert len(faults) == 1 and faults[0]["detail"]["bits"] == [27]
    assert sig.differing == 1 and sig.bits == {27: 1}
    assert sig.fields == {"sign": 0, "exponent": 1, "mantissa": 0}
    assert sig.positions == tuple(faults[0]["index"])
    assert sig.coordinates == ((faults[0]["index"][0] // 24, faults[0]["index"][0] % 24),)
    assert sig.ulps_max == 2**27  # bit 27's weight in the ordered integers
    assert "bit 27 x1" in sig.describe() and "1 exponent" in sig.describe()


def test_a_rule_hitting_every_32nd_element_shows_period_32() -> None:
    # The emulator draws its elements at random (faults/corrupt.py, elements or fraction): "every 32nd element" is
    # not a rule it can express, so the corrupted tensor is built here, as a warp-periodic fault would leave it.
    golden = torch.randn(8, 128)
    flat = golden.clone().reshape(-1)
    hit = torch.arange(7, flat.numel(), 32)
    flat[hit] = flip_bits(flat[hit], [3] * len(hit))
    sig = defect_signature(golden, flat.reshape(8, 128))
    assert sig.differing == 32 and sig.period == 32 and sig.offset == 7
    assert sig.bits == {3: 32} and sig.fields == {"sign": 0, "exponent": 0, "mantissa": 32}
    assert sig.ulps_max == 8 and sig.ulps_median == 8
    assert sig.positions[:3] == (7, 39, 71) and sig.coordinates[:2] == ((0, 7), (0, 39))
    assert "period 32 (offset 7)" in describe_json(sig.to_json())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_fields_and_ulps_in_every_layout(dtype: torch.dtype) -> None:
    golden = torch.tensor([1.0, 2.0, -3.0, 4.0], dtype=dtype)
    suspect = golden.clone()
    suspect[1] = (
        torch.nextafter(golden[1:2].float(), torch.tensor([9.0])).to(dtype)
        if dtype == torch.float32
        else flip_bits(golden[1:2], [0])
    )
    suspect[2] = -golden[2]
    sig = defect_signature(golden, suspect)
    width = torch.finfo(dtype).bits
    assert sig.bits == {0: 1, width - 1: 1} and sig.fields == {"sign": 1, "exponent": 0, "mantissa": 1}
    assert sig.differing == 2 and sig.period == 1 and sig.dtype == str(dtype).removeprefix("torch.")


def test_equal_tensors_have_an_empty_signature_and_others_are_refused() -> None:
    t = torch.randn(3, 100)
    sig = defect_signature(t, t.clone())
    assert sig.differing == 0 and sig.bits == {} and sig.period is None and sig.ulps_max == 0
    assert shape_class(t.shape) == "4x128" and sig.shape_class == "4x128"
    with pytest.raises(ValidationError, match="one shape and dtype"):
        defect_signature(t, t[:2])
    with pytest.raises(ValidationError, match="floating"):
        defect_signature(t.long(), t.long())


def test_the_verdict_of_a_set_of_runs() -> None:
    golden, suspect = [torch.zeros(4)], [torch.tensor([0.0, 1.0, 0.0, 0.0])]
    assert classify([golden, [golden[0].clone()]], golden, suspect) == "transient"
    assert classify([suspect, [suspect[0].clone()]], golden, suspect) == "persistent here"
    assert classify([golden, suspect], golden, suspect) == "nondeterministic"
    assert classify([[torch.ones(4)]], golden, suspect) == "unexplained"
    assert classify([[-golden[0]]], golden, suspect) == "unexplained"  # -0.0 is not 0.0, bit for bit
