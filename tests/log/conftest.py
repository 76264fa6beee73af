"""Shared fixtures: a realistic run header, real logs written by LogWriter (or framed as format v1), and a
frame walker that reads the documented byte layout independently of the reader."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.log.v1 import write_v1_log
from tests.log.v2 import write_v2_log
from tracer.log import SCHEMA_VERSION, EventRecord, LogWriter, Phase, RecordType, RunHeader, TensorRecord

Frame = tuple[int, int, int]  # (offset, record type, payload length)
DATA_TENSORS = (RecordType.TENSOR, RecordType.TENSOR_BLOCK)  # the frames that hold TENSOR records


@pytest.fixture
def header() -> RunHeader:
    return run_header()


def run_header() -> RunHeader:
    """The `header` fixture's value, for fixtures of a wider scope."""
    return RunHeader(
        schema_version=SCHEMA_VERSION,
        run_id="run-0001",
        node_label="node-a",
        role="train",
        world_size=2,
        rank=0,
        config={
            "optim": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8},
            "model": {"layers": 4, "dim": 64},
            "name": "tiny",
        },
        config_fingerprint="cfg-5f2a",
        seed=1234,
        data_order_fingerprint="data-77aa",
        fingerprint_algorithm="lanes64-v1",
        versions={"python": "3.11.7", "torch": "2.13.0", "sdctrace": "0.1.0"},
        device="cpu",
        determinism={"intra_op_threads": 1, "deterministic_algorithms": True},
        created_unix=1764400000.123456,
        extra={"fault_profile": None},
    )


def tensor(i: int, rng: random.Random) -> TensorRecord:
    """A realistic fingerprint record: a handful of sites per step, 64-bit fingerprints."""
    sites = ("attention", "mlp", "norm")
    return TensorRecord(
        step=i // 12,
        microbatch=i % 2,
        name=f"layers.{i % 4}.{sites[i % 3]}",
        phase=Phase(i % 5),
        fingerprint=rng.getrandbits(64),
        l2=rng.uniform(0, 1000),
        absmax=rng.uniform(0, 10),
        nan=0,
        inf=0,
        meta="bfloat16[8,64,128]",
    )


def records(n: int) -> list[TensorRecord | EventRecord]:
    """`n` tensor records with a `loss` event after every 10th, the same for every format version."""
    rng = random.Random(n)
    out: list[TensorRecord | EventRecord] = []
    for i in range(n):
        out.append(tensor(i, rng))
        if i % 10 == 9:
            out.append(EventRecord("loss", i // 12, {"loss": 2.5 - i / 1000}))
    return out


@pytest.fixture
def make_log(tmp_path: Path, header: RunHeader) -> Callable[..., Path]:
    """Writes `records(n)`, closed cleanly unless `close=False`: with LogWriter (format v3: tensor blocks with a
    check per row), or, with `version=1` or `2`, framed as the writers of those formats framed them (v1: one TENSOR
    record each; v2: tensor blocks whose only check is their frame's)."""

    def make(
        n: int = 60, *, segment_bytes: int = 64 << 20, close: bool = True, name: str = "rank-00000", version: int = 3
    ) -> Path:
        directory = tmp_path / name
        if version in (1, 2):
            write = write_v1_log if version == 1 else write_v2_log
            return write(directory, header, records(n), segment_bytes=segment_bytes, close=close)
        w = LogWriter(directory, header, segment_bytes=segment_bytes)
        for rec in records(n):
            if isinstance(rec, TensorRecord):
                w.write_tensor(rec)
            else:
                w.write_event(rec)
        if close:
            w.close()
        else:
            w.abandon()
        return directory

    return make


@pytest.fixture
def frames() -> Callable[[Path], list[Frame]]:
    """(offset, type, payload length) of every frame in a segment file, straight from the spec."""

    def walk(path: Path) -> list[Frame]:
        data = path.read_bytes()
        out, pos = [], 16
        while pos < len(data):
            length, _crc, rtype = struct.unpack_from("<IIB", data, pos)
            out.append((pos, rtype, length))
            pos += 9 + length
        assert pos == len(data), f"{path}: frames end at {pos}, file at {len(data)}"
        return out

    return walk


def in_frame(offset: int, f: Frame) -> bool:
    """Whether an entry at `offset` is (a record of) the frame `f`: a block's records sit at its offset + row."""
    return f[0] <= offset < f[0] + 9 + f[2]
