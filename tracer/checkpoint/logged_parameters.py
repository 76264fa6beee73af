"""The parameter fingerprints a rank's log recorded, and the check of a checkpoint against them.

A checkpoint's manifest holds the fingerprint of each of its tensors, so damage to the tensor alone is caught on
load; a tensor changed *together with* its manifest entry (what corruption during a checkpoint copy can leave)
is not. The log is the second witness: the checkpoint of step ``k`` is the state before step ``k`` runs, i.e.
the parameters after step ``k - 1``'s optimizer update, which the Tracer recorded as PARAM records of step
``k - 1`` (each rank its local shard of a DTensor). Every reader of checkpoints (plain and sharded, replay,
resume, the diff's drift) compares each ``model/<name>`` tensor's fingerprint with them::

    logged = logged_parameters(run_dir, rank, step)          # None: the log recorded none before that step
    check_logged(source, step, {"model/w": "00ab..."}, logged)   # CheckpointChangedError on a mismatch
    parameters_in_segments([(name, data), ...], steps)       # the same from segment bytes (any file system)

Where the log has no PARAM record of a tensor (parameters not recorded, a step sampled out, a lost region, no
log at all), nothing more is said: the manifest's own check still holds. A record that appears twice (a
resumed recording wrote the step again) counts as its last one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracer.errors import CheckpointChangedError, LogError
from tracer.log.columns import read_segment_columns
from tracer.log.layout import list_segments, rank_dir
from tracer.log.records import Phase
from tracer.log.segment import load_segment

MODEL_PREFIX = "model/"  # a checkpoint's model tensors: model/<parameter name as the log records it>


@dataclass(frozen=True)
class LoggedParameters:
    """PARAM fingerprints of one step of one rank's log: what the checkpoint of ``log_step + 1`` must hold."""

    log_step: int
    fingerprints: Mapping[str, int]  # parameter name -> fingerprint (unsigned 64-bit)


def parameters_in_segments(
    segments: Iterable[tuple[str, Callable[[], Any]]], checkpoint_steps: Collection[int]
) -> dict[int, LoggedParameters]:
    """Checkpoint step -> the PARAM fingerprints of the step before it, from one rank's segments in log order
    (name, a function giving the bytes). Unreadable or corrupt parts are passed over: they say nothing."""
    wanted = np.array(sorted({s - 1 for s in checkpoint_steps if s > 0}), dtype=np.int64)
    found: dict[int, dict[str, int]] = {}
    listed = list(segments)
    for i, (name, data) in enumerate(listed):
        if not len(wanted):
            break
        try:
            cols = read_segment_columns(data(), name, last=i == len(listed) - 1, on_corruption="skip")
        except (LogError, OSError):
            continue
        t = cols.tensors
        rows = np.flatnonzero((t.phase == int(Phase.PARAM)) & np.isin(t.step, wanted))
        for step, name_id, fp in zip(
            t.step[rows].tolist(), t.name[rows].tolist(), t.fingerprint[rows].tolist(), strict=True
        ):
            found.setdefault(step + 1, {})[t.strings[name_id]] = fp
    return {k: LoggedParameters(k - 1, fps) for k, fps in found.items()}


def logged_parameters(run_dir: str | Path, rank: int, step: int) -> LoggedParameters | None:
    """The PARAM fingerprints ``rank``'s log recorded at ``step - 1`` (None where it recorded none)."""
    directory = rank_dir(Path(run_dir), rank)
    if not directory.is_dir():
        return None
    segments = [(str(path), lambda path=path: load_segment(path)) for _, path in list_segments(directory)]
    return parameters_in_segments(segments, [step]).get(step)


def check_logged(source: str, step: int, fingerprints: Mapping[str, str], logged: LoggedParameters | None) -> None:
    """Refuse a checkpoint of ``step`` whose ``model/`` tensor fingerprints (16 hex digits, as its manifest holds
    them) differ from what the log recorded for those parameters; names without a record are not checked."""
    if logged is None:
        return
    for key, found in fingerprints.items():
        if not key.startswith(MODEL_PREFIX):
            continue
        want = logged.fingerprints.get(key.removeprefix(MODEL_PREFIX))
        if want is not None and found != f"{want:016x}":
            raise CheckpointChangedError(
                f"{source}: tensor {key!r} of the checkpoint of step {step} (fingerprint {found}) does not match "
                f"the fingerprint the log recorded at step {logged.log_step} ({want:016x}): the checkpoint was "
                "changed after it was written; re-record or restore it"
            )
