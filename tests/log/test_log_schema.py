"""Well-framed but malformed content: one test per failure mode, each made from a real run's files by re-encoding
one record (or the checkpoint manifest) with a wrong-typed or out-of-range field and framing it with a correct CRC,
so it reaches the content check. The reader refuses it naming file, byte offset and field; the CLI says so in
one line; nothing downstream sees the value.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from sdc.cli import main
from tests.log.v2 import as_v2
from tests.log.v3 import join_block, split_block
from tests.support import reframe
from tracer.checkpoint import load_checkpoint
from tracer.checkpoint.interface import checkpoint_files
from tracer.errors import LogCorruptionError, LogError, LogFormatError
from tracer.log import LogReader, RecordType, rank_dir
from tracer.log.checked_block import HEAD_SIZE
from tracer.log.codec import BLOCK_COLUMNS
from tracer.log.framing import frame
from tracer.log.records import MAX_BLOCK_ROWS, MAX_ELEMENTS, MAX_MICROBATCH, MAX_STEP


@pytest.fixture
def run(pretrained: Path, tmp_path: Path) -> Path:
    shutil.copytree(pretrained, tmp_path / "run")
    return tmp_path / "run"


def segment(run: Path) -> Path:
    return rank_dir(run, 0) / "000000.sdclog"


def frames(path: Path) -> list[tuple[int, int, bytes]]:
    data, out, pos = path.read_bytes(), [], 16
    while pos < len(data):
        length, _, rtype = struct.unpack_from("<IIB", data, pos)
        out.append((pos, rtype, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def first(path: Path, rtype: RecordType) -> tuple[int, object]:
    pos, _, payload = next(f for f in frames(path) if f[1] == rtype)
    return pos, msgpack.unpackb(payload, raw=False)


def craft_tensor(run: Path, index: int, value: object) -> int:
    """The run's first TENSOR_BLOCK replaced by a TENSOR record (formats v2 and v3 keep v1's) with one field changed."""
    path = segment(run)
    pos = next(f[0] for f in frames(path) if f[1] == RecordType.TENSOR_BLOCK)
    fields = [3, 0, 0, 0, 1, 0.5, 0.5, 0, 0, 0]  # string id 0 is defined before the first block
    fields[index] = value
    data = path.read_bytes()
    length = struct.unpack_from("<I", data, pos)[0]
    path.write_bytes(
        data[:pos] + frame(RecordType.TENSOR, msgpack.packb(fields, use_single_float=True)) + data[pos + 9 + length :]
    )
    return pos


def craft_block(run: Path, change: Callable[[list], object]) -> int:
    """The run's first TENSOR_BLOCK with `change` applied to its decoded `[step, rows, 9 columns]`, framed with a
    valid CRC (and, in format v3, heads whose CRCs match), in the format the segment file is in (`as_v2`)."""
    path = segment(run)
    version = struct.unpack_from("<H", path.read_bytes(), 8)[0]
    pos, _, payload = next(f for f in frames(path) if f[1] == RecordType.TENSOR_BLOCK)
    block = msgpack.unpackb(payload, raw=False) if version == 2 else split_block(payload)
    change(block)
    reframe(path, pos, msgpack.packb(block) if version == 2 else join_block(block))
    return pos


def column(block: list, field: str, values: list[int], fmt: str = "B") -> None:
    block[2 + [name for name, _, _ in BLOCK_COLUMNS].index(field)] = struct.pack(f"<{len(values)}{fmt}", *values)


def craft_header(run: Path, **run_fields: object) -> None:
    path = segment(run)
    pos, header = first(path, RecordType.HEADER)
    header["run"].update(run_fields)
    reframe(path, pos, msgpack.packb(header))


def inspect_error(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["inspect", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("index", "value", "field"),
    [
        (0, "7", "step"),
        (0, -1, "step"),
        (0, 2**41, "step"),
        (1, 1.5, "microbatch"),
        (4, "9e37", "fingerprint"),
        (5, "big", "l2"),
        (7, -3, "nan"),
        (8, None, "inf"),
    ],
)
def test_tensor_field_of_wrong_type_or_range_names_file_offset_and_field(run, capsys, index, value, field) -> None:
    pos = craft_tensor(run, index, value)
    with pytest.raises(LogCorruptionError, match=f"at byte {pos}: TENSOR field '{field}' must be"):
        list(LogReader(rank_dir(run, 0)).records())
    assert f"{segment(run)}: corrupt record at byte {pos}: TENSOR field '{field}'" in inspect_error(run, capsys)


def rows_of(block: list) -> int:
    return block[1]


# (change to the decoded [step, rows, 9 columns], the start of the error). Each column of the first block holds
# `rows` values; every field is checked as strictly as TENSOR's, and every count is bounded before anything is sized.
V2_BLOCK_CASES = [
    (lambda b: b.__setitem__(0, "7"), f"field 'step' must be an int in 0..{MAX_STEP}, found str"),
    (lambda b: b.__setitem__(0, -1), f"field 'step' must be an int in 0..{MAX_STEP}, found int -1"),
    (lambda b: b.__setitem__(0, 2**41), f"field 'step' must be an int in 0..{MAX_STEP}, found int {2**41}"),
    (lambda b: b.__setitem__(1, 0), f"field 'rows' must be an int in 1..{MAX_BLOCK_ROWS}, found int 0"),
    (lambda b: b.__setitem__(1, MAX_BLOCK_ROWS + 1), f"field 'rows' must be an int in 1..{MAX_BLOCK_ROWS}"),
    (lambda b: b.__setitem__(1, 2.0), "field 'rows' must be an int"),
    (
        lambda b: (column(b, "microbatch", [0] * rows_of(b)), b.__setitem__(1, b[1] - 1)),  # a row more than it says
        "field 'microbatch' must hold",
    ),
    (lambda b: b.__setitem__(3, "x" * len(b[3])), "payload must be an 11-element array"),  # a str, not a bin column
    (lambda b: b.pop(), "payload must be an 11-element array"),
    (lambda b: b.__setitem__(4, b"\x00" * 3 * rows_of(b)), "field 'phase' must hold"),  # 3 bytes a value
    (lambda b: b.__setitem__(6, b"\x00" * 8 * rows_of(b)), "field 'l2' must hold"),  # float64: not the format's
    (lambda b: column(b, "phase", [9] * rows_of(b)), "field 'phase' must be an int in 0..4, found 9 in row 0"),
    (
        lambda b: column(b, "microbatch", [0, MAX_MICROBATCH + 1] + [0] * (rows_of(b) - 2), "I"),
        f"field 'microbatch' must be an int in 0..{MAX_MICROBATCH}, found {MAX_MICROBATCH + 1} in row 1",
    ),
    (
        lambda b: column(b, "nan", [2**63] * rows_of(b), "Q"),
        f"field 'nan' must be an int in 0..{MAX_ELEMENTS}, found {2**63} in row 0",
    ),
    (lambda b: column(b, "meta_id", [250] * rows_of(b)), "refers to string id 250, which no earlier STRING"),
]
# Format v3's head holds step, rows and widths as unsigned ints of fixed size, so a str or a negative step cannot be
# written; what can be is refused as in v2.
V3_BLOCK_CASES = [
    (lambda b: b.__setitem__(0, 2**41), f"field 'step' must be an int in 0..{MAX_STEP}, found int {2**41}"),
    (lambda b: b.__setitem__(1, 0), f"field 'rows' must be an int in 1..{MAX_BLOCK_ROWS}, found int 0"),
    (lambda b: b.__setitem__(1, MAX_BLOCK_ROWS + 1), f"field 'rows' must be an int in 1..{MAX_BLOCK_ROWS}"),
    (lambda b: b.__setitem__(5, b[5] + b"\x00"), "head says"),  # a byte more: the columns do not add up
    (lambda b: b.__setitem__(4, b"\x00" * 3 * rows_of(b)), "field 'phase' must be of width 0, 1, 2, 4 or 8, found 3"),
    (lambda b: b.__setitem__(6, b"\x00" * 8 * rows_of(b)), "field 'l2' must be 4 bytes wide, found 8"),
    *V2_BLOCK_CASES[-4:],  # values out of range, an undefined string id
]
BLOCK_CASES = [(2, *case) for case in V2_BLOCK_CASES] + [(3, *case) for case in V3_BLOCK_CASES]


@pytest.mark.parametrize(("version", "change", "message"), BLOCK_CASES)
def test_tensor_block_field_of_wrong_shape_type_or_range_names_file_offset_and_field(
    run, capsys, version, change, message
):
    if version == 2:
        as_v2(segment(run))
    pos = craft_block(run, change)
    with pytest.raises(LogCorruptionError) as err:
        list(LogReader(rank_dir(run, 0)).records())
    assert (err.value.path, err.value.offset) == (str(segment(run)), pos)
    assert err.value.reason.startswith(f"TENSOR_BLOCK {message}"), err.value.reason
    assert f"{segment(run)}: corrupt record at byte {pos}: TENSOR_BLOCK" in inspect_error(run, capsys)


def test_v3_block_without_a_head_that_checks_is_corrupt(run) -> None:
    path = segment(run)
    pos, _, payload = next(f for f in frames(path) if f[1] == RecordType.TENSOR_BLOCK)
    reframe(path, pos, bytes(b ^ 0xFF for b in payload[: 2 * HEAD_SIZE]) + payload[2 * HEAD_SIZE :])
    with pytest.raises(
        LogCorruptionError, match=f"at byte {pos}: TENSOR_BLOCK payload of {len(payload)} bytes has no head"
    ):
        list(LogReader(rank_dir(run, 0)).records())


@pytest.mark.parametrize("version", [2, 3])
def test_a_bad_block_loses_its_records_and_nothing_else(run, version: int) -> None:
    pos, _, payload = next(f for f in frames(segment(run)) if f[1] == RecordType.TENSOR_BLOCK)
    rows = split_block(payload)[1]
    if version == 2:
        as_v2(segment(run))
    intact = list(LogReader(rank_dir(run, 0)).entries())
    craft_block(run, lambda b: column(b, "phase", [9] * rows_of(b)))
    in_block = [e for e in intact if e.segment == 0 and pos <= e.offset < pos + rows]
    reader = LogReader(rank_dir(run, 0), on_corruption="skip")
    assert list(reader.entries()) == [e for e in intact if e not in in_block]
    (lost,) = reader.status.lost
    # Step 0's: its checkpoint event comes before the block, more of its records after it.
    assert (lost.start, lost.records, lost.first_step, lost.last_step) == (pos, len(in_block), 0, 0)
    assert reader.status.lost_records == len(in_block) > 1 and reader.status.complete


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"created_unix": 1e300}, "'created_unix' must be a finite time"),
        ({"created_unix": float("nan")}, "'created_unix' must be a finite time"),
        ({"world_size": 0}, "'world_size' must be in 1.."),
        ({"world_size": 2**40}, "'world_size' must be in 1.."),
        ({"rank": 3}, "'rank' must be in 0..world_size-1"),
    ],
)
def test_header_value_out_of_range_is_refused(run, capsys, fields, message) -> None:
    craft_header(run, **fields)
    with pytest.raises(LogFormatError, match=f"^{segment(run)}: run header field {message}"):
        LogReader(rank_dir(run, 0))
    assert message in inspect_error(run, capsys)


def test_header_sites_that_are_not_a_list_of_names_are_refused(run, capsys) -> None:
    path = segment(run)
    pos, header = first(path, RecordType.HEADER)
    header["run"]["extra"]["sites"] = 12
    reframe(path, pos, msgpack.packb(header))
    with pytest.raises(LogFormatError, match="'extra.sites' must be a list of str"):
        LogReader(rank_dir(run, 0))
    assert "'extra.sites' must be a list of str" in inspect_error(run, capsys)


def test_blob_reference_of_the_wrong_type_is_corrupt(run, capsys) -> None:
    path = segment(run)
    pos, _ = first(path, RecordType.EVENT)
    fields = {"microbatch": 0, "name": "layers.0", "phase": 0, "fingerprint": "0123456789abcdef"}
    reframe(path, pos, msgpack.packb({"kind": "blob", "step": 0, "fields": fields}))
    with pytest.raises(LogCorruptionError, match=f"at byte {pos}: EVENT 'blob' field 'fields.fingerprint' must be"):
        list(LogReader(rank_dir(run, 0)).records())
    assert "field 'fields.fingerprint'" in inspect_error(run, capsys)


def test_event_step_out_of_range_is_corrupt(run) -> None:
    path = segment(run)
    pos, event = first(path, RecordType.EVENT)
    event["step"] = -5
    reframe(path, pos, msgpack.packb(event))
    with pytest.raises(LogCorruptionError, match=f"at byte {pos}: EVENT field 'step' must be an int in 0.."):
        list(LogReader(rank_dir(run, 0)).records())


def test_end_status_outside_the_spec_is_corrupt(run) -> None:
    path = segment(run)
    pos, end = first(path, RecordType.END)
    end["status"] = "exploded"
    reframe(path, pos, msgpack.packb(end))
    with pytest.raises(LogCorruptionError, match=f"at byte {pos}: END field 'status' must be one of"):
        list(LogReader(rank_dir(run, 0)).records())


def craft_manifest(run: Path, change) -> Path:  # noqa: ANN001
    path = run / checkpoint_files(2, 0)[0]
    manifest = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    change(manifest)
    path.write_bytes(msgpack.packb(manifest, use_bin_type=True))
    return path


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: m.pop("rng"), "'rng' is missing"),
        (lambda m: m.update(step=-2), "'step' must be an int"),
        (lambda m: m.update(step="2"), "'step' must be an int"),
        (lambda m: m.update(rank=[0]), "'rank' must be an int"),
        (lambda m: m.update(data=7), "'data' must be a map"),
        (
            lambda m: m["optimizer"]["param_groups"][0].update(lr="fast"),
            "'optimizer.param_groups[0].lr' must be a finite",
        ),
        (lambda m: m["optimizer"]["param_groups"][0].update(lr=float("inf")), "'optimizer.param_groups[0].lr'"),
        (lambda m: m["rng"].update(python=[3, [1, 2], None]), "'rng.python' must be"),
        (lambda m: m.update(fingerprints={"model/x": 5}), "'fingerprints' must map"),
    ],
)
def test_checkpoint_manifest_field_is_validated(run, change, field) -> None:
    craft_manifest(run, change)
    base = run / checkpoint_files(2, 0)[0].removesuffix(".msgpack")
    with pytest.raises(
        LogError, match=f"^{base}: checkpoint manifest field {field}".replace("[", r"\[").replace("]", r"\]")
    ):
        load_checkpoint(run, 2)
