"""A verdict only on verified evidence: `sdc incident reproduce` refuses, in one line and before any op runs, a
bundle whose recorded hashes fail for any file it holds, whose defect signatures disagree with its golden and
suspect outputs (changed after the capture, with the hash recorded anew), or whose ops ask for a tensor far larger
than any the bundle holds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from replay.bundle_check import MIN_ELEMENTS
from sdc.cli import main
from tests.replay.bundle_craft import edit_manifest, small_bundle


def _reproduce(bundle: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["incident", "reproduce", str(bundle), "--no-record", "--repeats", "1"])
    return code, capsys.readouterr().err.strip()


def _xor_suspect_byte(bundle: Path, offset: int, mask: int) -> None:
    """XOR a byte of the suspect output (the file's last 128 bytes: a 4 x 8 float32) and record the file's new
    SHA-256 in the manifest, as a forger would."""
    path = bundle / "tensors.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) - 128 + offset] ^= mask
    path.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()
    edit_manifest(bundle, lambda m: m["files"].update({"tensors.safetensors": digest}))


@pytest.mark.parametrize(
    "offset, mask, found",
    [
        (5 * 4 + 3, 1 << 3, 0),  # bit 27 of element 5 flipped back: the suspect now equals golden
        (31 * 4 + 1, 1, 2),  # another element flipped too
        (5 * 4 + 3, 1 << 2, 1),  # another bit of the same element: as many elements differ, not the same bits
    ],
)
def test_outputs_changed_with_their_hash_recorded_anew_get_no_verdict(
    tmp_path: Path, offset: int, mask: int, found: int, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    _xor_suspect_byte(bundle, offset, mask)
    code, err = _reproduce(bundle, capsys)
    assert code == 1 and err.count("\n") == 0, err
    assert (
        f"records 1 differing elements (bits {{27: 1}}) where golden.output.0 and suspect.output.0 differ in {found}"
        in err
    ), err


def test_golden_and_suspect_swapped_in_the_signatures_get_no_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    edit_manifest(bundle, lambda m: m.update(signatures=[]))  # as if no fault had been captured
    code, err = _reproduce(bundle, capsys)
    assert code == 1 and "records 0 differing elements" in err and err.count("\n") == 0, err


@pytest.mark.parametrize("name", ["reproduce.py", "bundle_check.py", "bounded_read.py"])
def test_a_script_changed_after_the_capture_gets_no_verdict(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    with open(bundle / name, "a") as f:
        f.write("\nprint('changed')\n")
    code, err = _reproduce(bundle, capsys)
    assert code == 1 and f"files.{name}" in err and "changed after the capture" in err and "\n" not in err, err


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m["files"].pop("reproduce.py"), "files.reproduce.py is missing while the bundle holds that file"),
        (lambda m: m.update(outputs=[[]]), "must name each output once"),
        (lambda m: m["ops"][1]["args"].__setitem__(0, {"t": []}), "neither the bundle holds"),
        (lambda m: m["site"].update(microbatch=1 << 63), "site.microbatch is negative or past 2^62"),
        (lambda m: m["signatures"][0]["bits"].update({"27": True}), "signatures[0].bits is missing or not a map"),
    ],
)
def test_crafted_fields_found_by_tools_fuzz_inputs_are_refused(
    tmp_path: Path, change, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    edit_manifest(bundle, change)
    code, err = _reproduce(bundle, capsys)
    assert code == 1 and words in err and "\n" not in err, err


def test_ops_that_draw_random_numbers_without_the_rng_state_get_no_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Written whole without rng.cpu (its hash consistent): each run of its dropout would draw anew, and the verdict
    # was "nondeterministic" (exit 5), a verdict on evidence the bundle lacks.
    bundle = small_bundle(tmp_path / "INC", dropout=0.5, rng=False)
    code, err = _reproduce(bundle, capsys)
    assert code == 1 and "\n" not in err, err
    assert "tensors.safetensors: tensor 'rng.cpu' is missing, while aten.bernoulli_.float draws random numbers" in err
    with_state = small_bundle(tmp_path / "WITH", dropout=0.5)
    assert _reproduce(with_state, capsys)[0] == 0  # transient: every run draws what the capture drew


def test_a_file_the_bundle_does_not_hold_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = small_bundle(tmp_path / "INC")
    edit_manifest(bundle, lambda m: m["files"].update({"../../etc/passwd": "0" * 64}))
    code, err = _reproduce(bundle, capsys)
    assert code == 1 and "is none of the files a bundle holds" in err and "\n" not in err, err


def _append_op(bundle: Path, op: str, args: list, results_shape: list[int]) -> None:
    def change(m: dict) -> None:
        k = len(m["ops"])
        result = {"ref": f"op.{k}.0", "shape": results_shape, "stride": [1] * len(results_shape), "dtype": "float32"}
        m["ops"].append({"op": op, "args": args, "kwargs": {}, "module": "", "results": [result]})

    edit_manifest(bundle, change)


HUGE = True  # the op asks for more than the bound: refused before any op runs


@pytest.mark.parametrize(
    "op, args, shape, huge",
    [
        # 2^31 elements asked for by the size argument, while the recorded result claims one element: an
        # allocation torch would make (lazily) before the result's shape could be compared
        ("aten.empty.memory_format", [[1 << 16, 1 << 15]], [1], HUGE),
        ("aten.randperm.default", [1 << 31], [1], HUGE),
        ("aten.arange.default", [float(1 << 31)], [1], HUGE),
        ("aten.linspace.default", [0.0, 1.0, 1 << 31], [1], HUGE),
        ("aten.new_empty.default", [{"t": "input.0"}, [1 << 31]], [1], HUGE),
        ("aten.empty.memory_format", [[1 << 12, 4097]], [1 << 12, 4097], HUGE),  # over 2^24, as the result says
        ("aten.zeros.default", [[64, 64]], [64, 64], False),
        ("aten.slice.Tensor", [{"t": "input.0"}, 1, 0, (1 << 63) - 1], [4, 8], False),  # x[:, 0:]: an index
        ("aten.linspace.default", [0.0, 1e30, 16], [16], False),  # its ends are values, its steps the size
    ],
)
def test_an_op_asking_for_a_huge_tensor_is_refused_before_any_op_runs(
    tmp_path: Path, op: str, args: list, shape: list[int], huge: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = small_bundle(tmp_path / "INC")
    _append_op(bundle, op, args, shape)
    code, err = _reproduce(bundle, capsys)
    if not huge:
        assert code == 0, err  # transient: the extra op's result is no output
        return
    assert code == 1 and f"({op}) asks for" in err and f"more than the {MIN_ELEMENTS:,}" in err, err
    assert err.count("\n") == 0, err
