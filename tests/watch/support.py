"""Logs of a few steps, written as the Tracer writes them, for the follower and resume tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tracer.log import SCHEMA_VERSION, EventRecord, LogWriter, Phase, RunHeader, TensorRecord
from tracer.log.sessions import Resumption

HEADER = RunHeader(
    schema_version=SCHEMA_VERSION,
    run_id="run-watch",
    node_label="node-a",
    role="train",
    world_size=1,
    rank=0,
    config={"model": {"layers": 2}},
    config_fingerprint="cfg-1",
    seed=1,
    data_order_fingerprint="data-1",
    fingerprint_algorithm="lanes64-v1",
    versions={"python": "3.11"},
    device="cpu",
    determinism={"intra_op_threads": 1},
    created_unix=1764400000.0,
    extra={},
)
NAMES = tuple(f"layers.{i}.{site}" for i in range(3) for site in ("attention", "feed_forward"))


def step_records(step: int) -> list[TensorRecord | EventRecord]:
    """One step as the Tracer records it: forward and backward of each site, then the `step` event; the
    fingerprints depend on the step and the name only, as a deterministic run's do."""
    out: list[TensorRecord | EventRecord] = []
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        for i, name in enumerate(NAMES):
            fp = (step * 1_000_003 + i * 7919 + int(phase)) * 2654435761 % (1 << 64)
            out.append(TensorRecord(step, 0, name, phase, fp, float(step + i), 1.0, 0, 0, "float32[2,8]"))
    out.append(EventRecord("step", step, {"loss": 1.0 / (step + 1)}))
    return out


def steps_records(steps: range) -> list[TensorRecord | EventRecord]:
    """`steps` as written: a checkpoint before every 5th."""
    out: list[TensorRecord | EventRecord] = []
    for step in steps:
        if step % 5 == 0:
            out.append(EventRecord("checkpoint", step, {"rank": 0}))
        out += step_records(step)
    return out


def write_steps(w: LogWriter, steps: range) -> None:
    """Write `steps`, flushing at the end of each, as the Tracer does."""
    for step in steps:
        for rec in steps_records(range(step, step + 1)):
            w.write_tensor(rec) if isinstance(rec, TensorRecord) else w.write_event(rec)
        w.flush()


def uninterrupted(directory: Path, steps: int, **kwargs) -> Path:
    with LogWriter(directory, HEADER, **kwargs) as w:
        write_steps(w, range(steps))
    return directory


def resumed(directory: Path, end_records: int, next_segment: int, step: int, last_step: int | None) -> Resumption:
    return dataclasses.replace(Resumption(next_segment, step, end_records), last_step=last_step)
