"""What the guard's detectors see of one decoded segment, taken from the diff's own decoding of the log.

`pipelines.log_source.DecodeSegment` decodes each segment once; for the golden and suspect
runs it also hands `segment_evidence` to `pipelines.alarms`, which rebuilds each step's
guard evidence from it: per step, the GRAD records' squared L2 norms and NaN/Inf counts
summed, and their names and fingerprints, from which `GradGroups.digest_inputs` builds
the bytes `tracer.guard.step_fingerprint` hashes (name, NUL, fingerprint as 8
little-endian bytes, per record in log order) with numpy rather than record by record;
and the events the detectors and their ground truth come from.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tracer.log.columns import SegmentColumns, TensorColumns
from tracer.log.records import Phase

EVIDENCE_KINDS = frozenset({"step", "fault", "abft", "guard", "replicas"})  # the event kinds `pipelines.alarms` reads
CHUNK_BYTES = 8 << 20  # padded record bytes built at once: bounds the memory this takes beside the columns


class GradGroups(NamedTuple):
    """A segment's GRAD tensor records in log order, in groups of one step (a run of equal steps): per record
    its name (a code into `strings`) and fingerprint, per group its step, where it ends, and its records'
    squared L2 norms and NaN/Inf counts, summed. Whole arrays: they cross a shuffle as a few buffers."""

    names: np.ndarray  # int32, per record
    fingerprints: np.ndarray  # uint64, per record
    steps: np.ndarray  # int64, per group
    ends: np.ndarray  # int64, per group: one past its last record
    squares: np.ndarray  # float64, per group
    nonfinite: np.ndarray  # int64, per group
    strings: list[str]

    def digest_inputs(self) -> list[memoryview]:
        """Per group, the bytes `tracer.guard.step_fingerprint` hashes for its records."""
        if not len(self.steps):
            return []
        blob, ends = _digest_bytes(self.names, self.fingerprints, self.strings)
        cuts = [0, *ends[self.ends - 1].tolist()]
        view = memoryview(blob)
        return [view[a:b] for a, b in zip(cuts, cuts[1:])]


class SegmentEvidence(NamedTuple):
    """One segment of a golden or suspect rank log, as the detector alarms read it."""

    side: str
    index: int  # the segment's, from its file name
    grads: GradGroups | None
    events: tuple[tuple[int, str, dict[str, Any]], ...]  # (step, kind, fields) of EVIDENCE_KINDS, in log order
    readable: bool = True  # False: decoding failed; the segments after it are not read either


def segment_evidence(side: str, index: int, seg: SegmentColumns) -> SegmentEvidence:
    events = tuple(
        (e.record.step, e.record.kind, e.record.fields) for e in seg.events if e.record.kind in EVIDENCE_KINDS
    )
    return SegmentEvidence(side, index, grad_groups(seg.tensors), events)


def grad_groups(t: TensorColumns) -> GradGroups:
    """A segment's GRAD records, one group per run of equal steps (log order)."""
    grad = np.flatnonzero(t.phase == int(Phase.GRAD))
    steps = t.step[grad]
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if len(grad) else np.zeros(0, np.int64)
    squares = np.add.reduceat(t.l2[grad].astype(np.float64) ** 2, starts) if len(grad) else np.zeros(0)
    nonfinite = np.add.reduceat(t.nan[grad] + t.inf[grad], starts) if len(grad) else np.zeros(0, np.int64)
    return GradGroups(
        t.name[grad],
        t.fingerprint[grad],
        steps[starts],
        np.r_[starts[1:], len(grad)].astype(np.int64),
        squares,
        nonfinite,
        t.strings,
    )


def _digest_bytes(names: np.ndarray, fingerprints: np.ndarray, strings: list[str]) -> tuple[bytes, np.ndarray]:
    """Every record's name, NUL and fingerprint (8 bytes, little-endian), one after another; and where each
    record's bytes end. Each record is first laid out padded to the longest name (a fixed-width row), then the
    padding is dropped with one mask, some thousands of records at a time."""
    used, codes = np.unique(names, return_inverse=True)  # codes: per record, its name's row in `used`
    encoded = [strings[c].encode("utf-8") + b"\0" for c in used.tolist()]
    lengths = np.array([len(e) for e in encoded], np.int64)
    ends = np.cumsum(lengths[codes] + 8)
    fps = np.ascontiguousarray(fingerprints, "<u8").view(np.uint8).reshape(-1, 8)
    width = int(lengths.max())
    if len(used) * width > CHUNK_BYTES:  # names of very different lengths: padding them all would cost too much
        return b"".join(encoded[c] + fp.tobytes() for c, fp in zip(codes.tolist(), fps)), ends
    padded = np.zeros((len(used), width), np.uint8)  # a row per name: its bytes and NUL, zero-padded
    for row, e in enumerate(encoded):
        padded[row, : len(e)] = np.frombuffer(e, np.uint8)
    keep_name = np.arange(width) < lengths[:, None]  # per name: which of its padded bytes are real
    parts = []
    rows = max(1, CHUNK_BYTES // (width + 8))
    for lo in range(0, len(names), rows):
        chunk = codes[lo : lo + rows]
        record = np.concatenate([padded[chunk], fps[lo : lo + rows]], axis=1)
        mask = np.concatenate([keep_name[chunk], np.ones((len(chunk), 8), bool)], axis=1)
        parts.append(record[mask])
    return np.concatenate(parts).tobytes(), ends
