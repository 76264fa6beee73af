"""Seeded fuzzing of a real run's log: flipped bytes, truncations, spliced segments, records re-encoded with
wrong-typed fields, and TENSOR_BLOCK columns and row counts rewritten (validly framed, so they reach the content
checks). For every variant the reader either reads it or raises an SdcError (nothing else, no hang: the log is
small, so reading it is a bounded amount of work), never maps more than the file holds, and in skip mode counts
every loss: a changed byte inside a record is skipped bytes, never silently accepted or dropped. The column reader
agrees with the reference reader on every variant, record for record and problem for problem.
"""

from __future__ import annotations

import random
import shutil
import struct
import warnings
from pathlib import Path

import msgpack
import pytest

from tests.log.v3 import join_block, split_block
from tests.support import reframe
from tracer.errors import SdcError
from tracer.log import LogReader, Phase, RecordType, TensorRecord, rank_dir, read_segment, read_segment_columns

SEEDS = range(200)
WRONG = ["x", -1, 2**64 - 1, -(2**63), 1.5, None, True, [1], {"a": 1}, b"\x00", float("nan")]


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jobs.record import record_run
    from tests.support import small_config

    out = tmp_path_factory.mktemp("fuzz") / "golden"
    from tracer.options import TraceOptions

    record_run(
        small_config("run.steps=2"), out, node_label="golden", progress=False, trace=TraceOptions(segment_bytes=4096)
    )
    return out


def frames(data: bytes) -> list[tuple[int, int, int]]:
    out, pos = [], 16
    while pos + 9 <= len(data):
        length, _, rtype = struct.unpack_from("<IIB", data, pos)
        out.append((pos, rtype, length))
        pos += 9 + length
    return out


def mutate(rank: Path, rng: random.Random) -> tuple[str, bool]:
    """Change one segment of `rank`; (what was done, whether bytes inside a record changed in place)."""
    segments = sorted(rank.glob("*.sdclog"))
    path = rng.choice(segments)
    data = bytearray(path.read_bytes())
    kind = rng.choice(["flip", "truncate", "splice", "reencode", "block"])
    if kind == "flip":
        record = rng.choice(frames(bytes(data)))
        at = rng.randrange(record[0], record[0] + 9 + record[2])
        data[at] ^= 1 << rng.randrange(8)
        path.write_bytes(data)
        return f"flip {path.name}@{at}", True
    if kind == "truncate":
        path.write_bytes(data[: rng.randrange(len(data))])
        return f"truncate {path.name}", False
    if kind == "splice":
        other = rng.choice(segments).read_bytes()
        cut, at = rng.randrange(len(data)), rng.randrange(len(other))
        path.write_bytes(bytes(data[:cut]) + other[at:])
        return f"splice {path.name}", False
    if kind == "block":
        blocks = [f for f in frames(bytes(data)) if f[1] == RecordType.TENSOR_BLOCK]
        if blocks:
            pos, _, length = rng.choice(blocks)
            block = split_block(bytes(data[pos + 9 : pos + 9 + length]))  # format v3's, which the run was written in
            reframe(path, pos, join_block(mutate_block(block, rng)))
            return f"block {path.name}@{pos}", False
    pos, rtype, length = rng.choice([f for f in frames(bytes(data)) if f[1] != RecordType.TENSOR_BLOCK])
    value = msgpack.unpackb(bytes(data[pos + 9 : pos + 9 + length]), raw=False)
    if isinstance(value, list) and value:
        value[rng.randrange(len(value))] = rng.choice(WRONG)
    elif isinstance(value, dict) and value:
        value[rng.choice(sorted(value))] = rng.choice(WRONG)
    reframe(path, pos, msgpack.packb(value, use_single_float=rtype == 3))
    return f"reencode {path.name}@{pos}", False


def mutate_block(block: list, rng: random.Random) -> list:
    """A TENSOR_BLOCK `[step, rows, 9 columns]` with its row count or one column rewritten."""
    rows = block[1]
    if rng.random() < 0.2:
        block[1] = rng.choice([0, 1, rows - 1, rows + 1, rows * 8, 2**16, 2**16 + 1, 2**40])
        return block
    i = rng.randrange(2, len(block))
    col = bytearray(block[i])
    how = rng.choice(["byte", "width", "length"])
    if how == "byte" and col:
        col[rng.randrange(len(col))] = rng.choice([0, 1, 4, 5, 0x7F, 0x80, 0xFF])  # e.g. a phase, an undefined id
    elif how == "width":  # every row of another width, with values from small to the top of the width
        width = rng.choice([0, 1, 2, 3, 4, 8])
        top = 2 ** (8 * width) - 1
        col = bytearray(b"".join(rng.choice([0, min(1, top), top]).to_bytes(width, "little") for _ in range(rows)))
    else:
        col = col[: rng.randrange(len(col) + 1)] + bytes(rng.randrange(3))
    block[i] = bytes(col)
    return block


def agree(data: bytes, path: Path) -> None:
    """The column reader and the reference reader find the same records and the same problems."""
    try:
        _, entries, status = read_segment(data, str(path), last=True, on_corruption="skip")
        expected = [(e.offset, e.record) for e in entries]
    except SdcError as e:
        with pytest.raises(type(e)):
            read_segment_columns(data, str(path), last=True, on_corruption="skip")
        return
    cols = read_segment_columns(data, str(path), last=True, on_corruption="skip")
    t = cols.tensors
    got = [
        (
            int(t.offset[i]),
            TensorRecord(
                int(t.step[i]),
                int(t.microbatch[i]),
                t.strings[t.name[i]],
                Phase(int(t.phase[i])),
                int(t.fingerprint[i]),
                float(t.l2[i]),
                float(t.absmax[i]),
                int(t.nan[i]),
                int(t.inf[i]),
                t.strings[t.meta[i]],
            ),
        )
        for i in range(len(t))
    ]
    got = sorted(got + [(e.offset, e.record) for e in cols.events], key=lambda x: x[0])
    same = lambda a, b: a == b or repr(a) == repr(b)  # noqa: E731 - NaN stats compare unequal to themselves
    assert len(got) == len(expected) and all(same(a, b) for a, b in zip(got, expected)), path
    assert (cols.status.corruptions, cols.status.lost) == (status.corruptions, status.lost), path


@pytest.mark.parametrize("seed", SEEDS)
def test_any_variant_reads_or_raises_an_sdc_error(golden: Path, tmp_path: Path, seed: int) -> None:
    run = tmp_path / "run"
    shutil.copytree(golden / "rank-00000", rank_dir(run, 0))
    rank = rank_dir(run, 0)
    what, changed_in_place = mutate(rank, random.Random(seed))
    sizes = {p: p.stat().st_size for p in rank.glob("*.sdclog")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mode in ("raise", "skip"):
            try:
                reader = LogReader(rank, on_corruption=mode)
                records = sum(1 for _ in reader.records())
            except SdcError:
                continue
            status = reader.status
            assert records == status.records, what
            if mode == "skip" and changed_in_place:
                # A flipped bit is caught by the CRC (or breaks the frame): something must be counted as lost.
                assert status.skipped_bytes > 0 or status.corruptions or status.torn_tail, what
        for path, size in sizes.items():
            data = path.read_bytes()
            assert len(data) == size  # what the readers mapped: never more than the file
            agree(data, path)
