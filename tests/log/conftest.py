"""Shared fixtures: a realistic run header, real logs written by LogWriter, and a frame
walker that reads the documented byte layout independently of the reader."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tracer.log import SCHEMA_VERSION, EventRecord, LogWriter, Phase, RunHeader, TensorRecord

Frame = tuple[int, int, int]  # (offset, record type, payload length)


@pytest.fixture
def header() -> RunHeader:
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


@pytest.fixture
def make_log(tmp_path: Path, header: RunHeader) -> Callable[..., Path]:
    """Writes `n` tensor records with an event every 10th, closed cleanly unless `close=False`."""

    def make(n: int = 60, *, segment_bytes: int = 64 << 20, close: bool = True, name: str = "rank-00000") -> Path:
        directory = tmp_path / name
        rng = random.Random(n)
        w = LogWriter(directory, header, segment_bytes=segment_bytes)
        for i in range(n):
            w.write_tensor(tensor(i, rng))
            if i % 10 == 9:
                w.write_event(EventRecord("loss", i // 12, {"loss": 2.5 - i / 1000}))
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
