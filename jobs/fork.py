"""Fork a recorded run at one of its checkpoints: a new run directory that holds the run's history up to that
checkpoint and goes on from it, as ``sdc record --out NEW --resume-from RUN/checkpoints/step-NNNNNN`` does.

    point = fork_point(Path("runs/suspect/checkpoints/step-000005"))   # ForkPoint(run=runs/suspect, step=5)
    fork_run(point, Path("runs/resumed"), node_label="node-b", node_extra={}, segment_bytes=64 << 20)

The checkpoint is typically the one `sdc certify` names: the last one at which the run still matched its golden
run. `fork_run` writes, into the claimed new directory, each rank's log of the steps before the checkpoint (every
record of them, in log order, under a header of a new run id that names the node that goes on and says where it
was forked from: ``extra.forked_from``), left without END so it reads as a crashed run, and copies the
checkpoints up to that one (and the blobs the copied records captured). `jobs.record` then resumes it as any
crashed run (`tracer.log.resume`): from that checkpoint, on this node, with this node's emulated faults or none.
The source run is only read.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracer.blobs import BlobStore
from tracer.checkpoint import checkpoint_dir, list_step_checkpoints
from tracer.errors import UsageError
from tracer.log import LogReader, LogWriter, list_ranks, rank_dir
from tracer.log.layout import CHECKPOINT_DIR
from tracer.log.records import EventRecord
from tracer.log.sessions import RESUME, is_failed_session

_STEP_DIR = re.compile(r"step-(\d{6,})")
# The header's extra about the recording session, not the training: the node going on sets its own (its guard's is
# in the Tracer's header of the resumed segments).
SESSION_KEYS = ("workload", "fault_profile", "abft", "guard")


@dataclass(frozen=True)
class ForkPoint:
    """A checkpoint of a recorded run: the state before ``step``."""

    run: Path
    step: int


def fork_point(checkpoint: Path) -> ForkPoint:
    """The run and step of a checkpoint directory ``<run>/checkpoints/step-NNNNNN`` (what `sdc certify` prints)."""
    path = Path(checkpoint)
    m = _STEP_DIR.fullmatch(path.name)
    if m is None or path.parent.name != CHECKPOINT_DIR or not path.is_dir():
        raise UsageError(
            f"--resume-from {checkpoint}: expected a checkpoint directory RUN/{CHECKPOINT_DIR}/step-NNNNNN "
            "(what `sdc certify` prints)"
        )
    point = ForkPoint(path.parent.parent, int(m[1]))
    ranks = list_ranks(point.run)
    if not ranks:
        raise UsageError(f"--resume-from {checkpoint}: {point.run} holds no rank logs: not a recorded run")
    missing = [rank for rank in ranks if point.step not in list_step_checkpoints(point.run, rank)]
    if missing:
        raise UsageError(
            f"--resume-from {checkpoint}: rank(s) {missing} of {point.run} have no complete checkpoint "
            f"of step {point.step}"
        )
    return point


def fork_run(
    point: ForkPoint, out: Path, *, node_label: str, node_extra: Mapping[str, Any], workload: str, segment_bytes: int
) -> None:
    """Write into the claimed, empty ``out`` every rank's history before ``point.step``, and its checkpoints up to
    it, so that resuming ``out`` goes on from ``point`` on the node ``node_label`` with ``node_extra`` (its
    `faults.node.node_header`) and ``workload``."""
    for rank in list_ranks(point.run):
        _fork_log(point, out, rank, node_label, {**node_extra, "workload": workload}, segment_bytes)
    steps = {step for rank in list_ranks(point.run) for step in list_step_checkpoints(point.run, rank)}
    for step in sorted(s for s in steps if s <= point.step):
        shutil.copytree(checkpoint_dir(point.run, step), checkpoint_dir(out, step))


def _fork_log(
    point: ForkPoint, out: Path, rank: int, node_label: str, node_extra: Mapping[str, Any], segment_bytes: int
) -> None:
    """Rank ``rank``'s records of the steps before the fork, under the forked run's header, without END."""
    reader = LogReader(rank_dir(point.run, rank))  # a damaged history is refused: never resume what was not read
    source = reader.header
    extra = {k: v for k, v in source.extra.items() if k not in SESSION_KEYS}
    extra.update(node_extra)
    extra["forked_from"] = {
        "run": str(point.run),
        "run_id": source.run_id,
        "node_label": source.node_label,
        "step": point.step,
    }
    header = dataclasses.replace(source, run_id=uuid.uuid4().hex, node_label=node_label, extra=extra)
    blobs_in, blobs_out = BlobStore(point.run), BlobStore(out)
    writer = LogWriter(rank_dir(out, rank), header, segment_bytes=segment_bytes)
    try:
        for rec in reader.records():
            if rec.step >= point.step:
                continue
            if isinstance(rec, EventRecord):
                if rec.kind == RESUME or is_failed_session(rec):  # the source's sessions, not training
                    continue
                if rec.kind == "blob" and int(rec.fields["fingerprint"]) in blobs_in:
                    target = blobs_out.path(int(rec.fields["fingerprint"]))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(blobs_in.path(int(rec.fields["fingerprint"])), target)
                writer.write_event(rec)
            else:
                writer.write_tensor(rec)
        writer.flush(fsync=True)
    finally:
        writer.abandon()  # no END: the log reads as a crashed run, which the record job resumes
