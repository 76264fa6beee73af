"""Read run directories into Beam: segments in parallel, tensors as Arrow record batches.

Everything goes through Beam's file systems, so ``gs://`` or ``s3://`` runs work where
the matching apache-beam extra is installed. A run is described once on the launcher
(`describe_run`: its segments, each rank's run header); `ReadRuns` then decodes every
segment of every run on the workers with `tracer.log.read_segment_columns`, in skip
mode so that every problem in a segment is found, and emits:

- ``tensors`` (golden and suspect only): ``((rank, step // steps_per_bucket), (side,
  packed batch))``, thousands of TENSOR records per element, so no runner pays
  per-record overhead; one GroupByKey then brings a bucket's batches of both runs
  together (a CoGroupByKey would add a Flatten that runners do not always fuse). A
  batch crosses the shuffle as LZ4-compressed Arrow IPC bytes (`pack_batch`): a third
  of its size in memory, and a local runner's shuffle costs far more per byte than LZ4;
- ``events``: ``((side, kind, rank), EventBatch)``, one batch per segment and kind;
- ``segments``: one `SegmentInfo` per segment, which `SummariseRanks` turns into the
  checks between segments (`tracer.log.check_chain`) and per-rank facts;
- ``evidence`` (golden and suspect only): ``(rank, SegmentEvidence)``, what the guard's
  detectors see of the segment (`pipelines.segment_evidence`), for `pipelines.alarms`: the
  logs are decoded once;
- ``tables``: rows of the ``corruptions`` and ``errors`` tables, each problem counted in
  Beam metrics. Corruption is reported with file and byte offset; whether it fails
  the job is the launcher's decision (`pipelines.staging`), so a job finds every problem.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipelines.segment_evidence import SegmentEvidence, segment_evidence
from pipelines.tables import TABLES, named
from pipelines.tagged_outputs import split
from tracer.checkpoint.interface import CHECKPOINT_GLOB, parse_checkpoint_path
from tracer.errors import LogError, LogFormatError, UsageError
from tracer.log import (
    SEGMENT_GLOB,
    LostRange,
    RunHeader,
    SegmentSummary,
    Sessions,
    chain_lost,
    check_chain,
    list_ranks,
    parse_segment_path,
    rank_dir_name,
    read_segment,
    read_segment_columns,
    resumption_in,
    segment_name,
)
from tracer.log.columns import TensorColumns
from tracer.log.layout import list_segments
from tracer.regular_files import open_regular, read_regular

NAMESPACE = "sdctrace"
TENSORS, EVENTS, SEGMENTS, RANKS, EVIDENCE = "tensors", "events", "segments", "ranks", "evidence"
DIFFED = ("golden", "suspect")  # the sides whose tensor records are joined; replay logs and the twin give events only
TWIN = "twin"  # a fine-tune's shuffle-seed twin (`sdc diff --twin`)
# Event kinds some table is made of; others are counted (events_of_unused_kinds), not kept.
FINETUNE_KINDS = frozenset({"finetune_eval", "finetune_prediction"})
DIFFED_KINDS = frozenset({"step", "fault", "abft", "sharpness"}) | FINETUNE_KINDS
REPLAY_KINDS = frozenset({"site_mismatch", "grad_noise"})

TENSOR_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("microbatch", pa.int64()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("phase", pa.int8()),
        ("fingerprint", pa.uint64()),
        ("l2", pa.float32()),
        ("absmax", pa.float32()),
        ("nan", pa.int64()),
        ("inf", pa.int64()),
        ("meta", pa.dictionary(pa.int32(), pa.string())),
        ("segment", pa.int32()),
        ("offset", pa.int64()),
    ]
)

_HEAD_BYTES = 64 << 10  # enough for a run header unless the config is huge; then the whole file is read


@dataclass(frozen=True)
class RankLayout:
    rank: int
    header: RunHeader
    segments: tuple[tuple[int, str], ...]  # (index, path), ascending
    sessions: Sessions = Sessions()  # the log's resumptions (tracer.log.sessions)


@dataclass(frozen=True)
class RunLayout:
    """What the launcher knows about a run before the job starts."""

    path: str
    ranks: dict[int, RankLayout]
    bytes: int  # all segments together

    @property
    def header(self) -> RunHeader:
        """The lowest rank's header: what the run as a whole is compared by."""
        return self.ranks[min(self.ranks)].header


class SegmentTask(NamedTuple):
    side: str
    rank: int
    index: int
    path: str
    last: bool
    run_id: str
    session_end: bool = False
    cutoff: int | None = None


class EventRow(NamedTuple):
    rank: int
    step: int
    segment: int
    offset: int
    fields: dict[str, Any]


@dataclass(frozen=True)
class EventBatch:
    """One segment's events of one kind, held as plain tuples in one object: coders pickle it in one
    call at C speed, not row by row."""

    records: tuple[tuple[int, int, int, int, dict[str, Any]], ...]

    @property
    def rows(self) -> Iterator[EventRow]:
        return (EventRow(*r) for r in self.records)


class SegmentInfo(NamedTuple):
    side: str
    rank: int
    summary: SegmentSummary
    records: int
    complete: bool
    torn_tail: bool
    last_step_event: int | None  # largest step with a `step` event (a completed step)
    last_tensor_step: int | None
    corrupt: bool = False  # reading it found corruption
    end_status: str | None = None  # its END record's status (None: no END)


@dataclass(frozen=True)
class RankInfo:
    """Per (run, rank) facts gathered from all its segments."""

    side: str
    rank: int
    segments: int
    records: int
    complete: bool
    torn_tail: bool
    last_step: int | None  # last completed step: from `step` events, else the last tensor's
    lost: tuple[LostRange, ...] = ()  # what corruption hid (`tracer.log.chain_lost`)
    status: str = "complete"  # complete, failed (END says training raised), crashed (no END), corrupt (skipped data)

    @property
    def lost_steps(self) -> tuple[tuple[int | None, int | None], ...]:
        """(first, last) steps corruption made unknown; None: from the start, through the end."""
        return tuple((r.first_step, r.last_step) for r in self.lost)


def describe_run(path: str) -> RunLayout:
    """List a run's segments and read each rank's run header, through Beam's file systems."""
    by_rank: dict[int, list[tuple[int, str]]] = {}
    size = 0
    for file, file_size in segment_files(path):
        parsed = parse_segment_path(file)
        if parsed is not None:
            by_rank.setdefault(parsed[0], []).append((parsed[1], file))
            size += file_size
    if not by_rank:
        raise LogFormatError(
            f"{path}: holds no log segments ({rank_dir_name(0)}/{segment_name(0)}, ...); "
            "pass a run directory made by `sdc record`"
        )
    ranks = {}
    for rank, segments in sorted(by_rank.items()):
        segments.sort()
        sessions = Sessions(tuple(r for i, p in segments[1:] if (r := resumption_in(read_file(p, _HEAD_BYTES), p, i))))
        ranks[rank] = RankLayout(
            rank, _first_header(segments, f"{path}/{rank_dir_name(rank)}"), tuple(segments), sessions
        )
    return RunLayout(path, ranks, size)


def segment_files(path: str) -> list[tuple[str, int]]:
    """(path, size) of every segment file of a run. A local run is listed as `tracer.log.LogReader` and replay list
    it, following a rank folder that is a symlink (a user's own folder: the paths a log holds are what is never
    trusted); Beam's local glob would not follow it. Other file systems are listed through Beam's."""
    if FileSystems.get_scheme(path) in (None, "file"):
        run = Path(path.removeprefix("file://"))
        return [
            (str(p), p.stat().st_size)
            for rank in list_ranks(run)
            for _, p in list_segments(run / rank_dir_name(rank))
            if p.is_file()
        ]
    try:
        matches = FileSystems.match([FileSystems.join(path, SEGMENT_GLOB)])[0].metadata_list
    except ValueError as e:  # no file system for the scheme
        raise UsageError(f"{path}: {e}") from None
    return [(m.path, m.size_in_bytes) for m in matches]


def list_checkpoints(path: str) -> dict[int, set[int]]:
    """rank -> steps with a complete checkpoint (its manifest is renamed into place last)."""
    found: dict[int, set[int]] = {}
    for m in FileSystems.match([FileSystems.join(path, CHECKPOINT_GLOB)])[0].metadata_list:
        parsed = parse_checkpoint_path(m.path)
        if parsed is not None:
            found.setdefault(parsed[1], set()).add(parsed[0])
    return found


def read_file(path: str, limit: int | None = None) -> bytes:
    """A file's bytes (at most `limit`), bounded by its size: a local path must be a regular file (a FIFO
    would block, /dev/zero never end, tracer.regular_files); any other file system reads at most its listed size."""
    if FileSystems.get_scheme(path) in (None, "file"):
        local = path.removeprefix("file://")
        if limit is None:
            return read_regular(local, "run file")
        f, size = open_regular(local, "run file")
        with f:
            return f.read(min(size, limit))
    try:
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    except (IndexError, ValueError, OSError) as e:
        raise LogError(f"{path}: cannot read ({e})") from None
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read(size if limit is None else min(size, limit))


def _first_header(segments: list[tuple[int, str]], where: str) -> RunHeader:
    """Every segment repeats the header: a damaged one is found in the next, as LogReader does."""
    for _, seg_path in segments:
        header = _read_header(seg_path)
        if header is not None:
            return header
    raise LogFormatError(
        f"{where}: no segment holds a readable run header (the writer died before writing one, "
        "or every copy is damaged)"
    )


def _read_header(path: str) -> RunHeader | None:
    data = read_file(path, _HEAD_BYTES)
    if len(data) == _HEAD_BYTES:
        head, _, _ = _quiet_head(data, path)
        if head is not None:
            return head
        data = read_file(path)
    return _quiet_head(data, path)[0]


def _quiet_head(data: bytes, path: str) -> tuple[RunHeader | None, Any, Any]:
    # A prefix may end inside a record: that reads as a torn tail, harmlessly, so no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_segment(data, path, last=True, on_corruption="skip")


class ReadRuns(beam.PTransform):
    """Decode every segment of every run (side -> layout) -> {TENSORS, EVENTS, SEGMENTS, EVIDENCE, TABLES
    (corruptions, errors)}. `spread`: reshuffle the segments over the workers (pointless in one process)."""

    def __init__(self, runs: Mapping[str, RunLayout], steps_per_bucket: int, spread: bool = True) -> None:
        super().__init__()
        self.runs, self.steps_per_bucket, self.spread = dict(runs), steps_per_bucket, spread

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        tasks = [
            SegmentTask(
                side,
                r.rank,
                index,
                path,
                index == r.segments[-1][0],
                r.header.run_id,
                r.sessions.ends_session(index),
                r.sessions.cutoff(index),
            )
            for side, run in self.runs.items()
            for r in run.ranks.values()
            for index, path in r.segments
        ]
        decoded = (
            pbegin
            | "List segments" >> beam.Create(tasks, reshuffle=self.spread)  # spread: over the workers
            | "Decode segments" >> beam.ParDo(DecodeSegment(self.steps_per_bucket))
        )
        return split(decoded, (TENSORS, EVENTS, SEGMENTS, EVIDENCE, TABLES), "Decoded")


def used(side: str, kind: str) -> bool:
    """Whether some table is made of this event kind of this run."""
    return kind in (DIFFED_KINDS if side in DIFFED else FINETUNE_KINDS if side == TWIN else REPLAY_KINDS)


class DecodeSegment(beam.DoFn):
    """One segment file -> tensor batches per step bucket, event batches per kind, facts, the detectors'
    evidence (golden and suspect), problems."""

    def __init__(self, steps_per_bucket: int) -> None:
        self.steps_per_bucket = steps_per_bucket

    def setup(self) -> None:
        counter = lambda name: Metrics.counter(NAMESPACE, name)  # noqa: E731
        self.segments, self.tensor_records, self.event_records = (
            counter("segments_read"),
            counter("tensor_records"),
            counter("event_records"),
        )
        self.unused_events, self.corrupt, self.skipped = (
            counter("events_of_unused_kinds"),
            counter("corruptions"),
            counter("corrupt_records_skipped"),
        )
        self.torn, self.errors = counter("torn_tails"), counter("unreadable_segments")

    def process(self, task: SegmentTask) -> Iterator[tuple[str, Any]]:
        try:
            data = read_file(task.path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a torn tail is in the status, counted below
                seg = read_segment_columns(
                    data,
                    task.path,
                    last=task.last,
                    on_corruption="skip",
                    session_end=task.session_end,
                    cutoff=task.cutoff,
                )
            if seg.header is not None and (seg.header.run_id, seg.header.rank) != (task.run_id, task.rank):
                raise LogFormatError(
                    f"{task.path}: segment of run {seg.header.run_id} rank {seg.header.rank}, but the rank's first "
                    f"segment is of run {task.run_id} rank {task.rank}: two logs are mixed in one directory"
                )
        except (LogError, OSError) as e:
            self.errors.inc()
            row = {"side": task.side, "rank": task.rank, "path": task.path, "message": str(e)}
            yield TABLES, named("errors", [row])
            if task.side in DIFFED:
                yield EVIDENCE, (task.rank, SegmentEvidence(task.side, task.index, None, (), readable=False))
            return
        status = seg.status
        self.segments.inc()
        self.tensor_records.inc(len(seg.tensors))
        self.event_records.inc(len(seg.events))
        self.skipped.inc(status.skipped_records)
        self.torn.inc(int(status.torn_tail))
        if status.corruptions:
            self.corrupt.inc(len(status.corruptions))
            rows = [corruption_row(task.run_id, task.side, task.rank, *c) for c in status.corruptions]
            yield TABLES, named("corruptions", rows)
        index = task.index  # the file name's: what locates the record (a wrong header index is reported)
        if task.side in DIFFED:
            for key, batch in bucket_batches(seg.tensors, index, self.steps_per_bucket):
                yield TENSORS, ((task.rank, key), (task.side, pack_batch(batch)))
            yield EVIDENCE, (task.rank, segment_evidence(task.side, index, seg))
        by_kind: dict[str, list[tuple[int, int, int, int, dict[str, Any]]]] = {}
        for e in seg.events:
            by_kind.setdefault(e.record.kind, []).append((task.rank, e.record.step, index, e.offset, e.record.fields))
        for kind, rows in by_kind.items():
            if used(task.side, kind):
                yield EVENTS, ((task.side, kind, task.rank), EventBatch(tuple(rows)))
            else:
                self.unused_events.inc(len(rows))
        steps = [r[1] for r in by_kind.get("step", [])]
        yield (
            SEGMENTS,
            SegmentInfo(
                task.side,
                task.rank,
                seg.summary(task.index, task.path),
                status.records,
                status.complete,
                status.torn_tail,
                max(steps) if steps else None,
                int(seg.tensors.step.max()) if len(seg.tensors) else None,
                bool(status.corruptions),
                status.end.status if status.end is not None else None,
            ),
        )


def bucket_batches(cols: TensorColumns, segment: int, steps_per_bucket: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Split a segment's tensor columns into one record batch per step bucket, copying each slice."""
    if not len(cols):
        return
    bucket = cols.step // steps_per_bucket
    order = None if bool((bucket[1:] >= bucket[:-1]).all()) else np.argsort(bucket, kind="stable")
    if order is not None:
        bucket = bucket[order]
    cuts = np.flatnonzero(bucket[1:] != bucket[:-1]) + 1
    strings = pa.array(cols.strings, pa.string())  # name and meta codes index the same list
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(bucket)]):
        take = slice(lo, hi) if order is None else order[lo:hi]
        part = lambda a, take=take: np.ascontiguousarray(a[take])  # noqa: E731 - a copy: slices would pickle whole buffers
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(part(cols.step)),
                pa.array(part(cols.microbatch)),
                pa.DictionaryArray.from_arrays(pa.array(part(cols.name)), strings),
                pa.array(part(cols.phase)),
                pa.array(part(cols.fingerprint)),
                pa.array(part(cols.l2)),
                pa.array(part(cols.absmax)),
                pa.array(part(cols.nan)),
                pa.array(part(cols.inf)),
                pa.DictionaryArray.from_arrays(pa.array(part(cols.meta)), strings),
                pa.array(np.full(hi - lo, segment, np.int32)),
                pa.array(part(cols.offset)),
            ],
            schema=TENSOR_SCHEMA,
        )
        yield int(bucket[lo]), batch


# A batch's few buffers: pyarrow's threads would cost more CPU than they save.
_PACKED = pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None, use_threads=False)
_UNPACK = pa.ipc.IpcReadOptions(use_threads=False)


def pack_batch(batch: pa.RecordBatch) -> bytes:
    """A bucket batch as it crosses the shuffle: one Arrow IPC stream, LZ4-compressed where pyarrow has LZ4."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_PACKED) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def unpack_batch(packed: bytes | pa.RecordBatch) -> pa.RecordBatch:
    """What `pack_batch` made, back as a record batch (a batch that was never packed passes as it is)."""
    if isinstance(packed, pa.RecordBatch):
        return packed
    return pa.ipc.open_stream(packed, options=_UNPACK).read_next_batch()


def corruption_row(run_id: str, side: str, rank: int, path: str, offset: int, reason: str) -> dict[str, Any]:
    return {"run_id": run_id, "side": side, "rank": rank, "path": path, "offset": offset, "reason": reason}


class SummariseRanks(beam.PTransform):
    """Segment facts -> RANKS: one `RankInfo` per (side, rank); TABLES: the runs rows and the problems
    between segments."""

    def __init__(self, runs: Mapping[str, RunLayout]) -> None:
        super().__init__()
        self.runs = dict(runs)

    def expand(self, infos: beam.PCollection) -> dict[str, beam.PCollection]:
        summaries = (
            infos
            | "Key by rank" >> beam.Map(lambda i: ((i.side, i.rank), i))
            | "Group segments" >> beam.GroupByKey()
            | "Check chains" >> beam.ParDo(_SummariseRank(self.runs))
        )
        return split(summaries, (RANKS, TABLES), "Rank")


class _SummariseRank(beam.DoFn):
    def __init__(self, runs: dict[str, RunLayout]) -> None:
        self.runs = runs

    def setup(self) -> None:
        self.corrupt = Metrics.counter(NAMESPACE, "corruptions")

    def process(self, element: tuple[tuple[str, int], Iterable[SegmentInfo]]) -> Iterator[tuple[str, Any]]:
        (side, rank), infos = element
        infos = sorted(infos, key=lambda i: i.summary.index)
        run = self.runs[side]
        header = run.ranks[rank].header
        directory = infos[0].summary.path.rsplit("/", 1)[0]
        missing = lambda i: f"{directory}/{segment_name(i)}"  # noqa: E731
        problems = check_chain([i.summary for i in infos], missing)
        lost = tuple(chain_lost([i.summary for i in infos], missing))
        if lost:
            yield TABLES, named("lost_ranges", [lost_row(header.run_id, side, rank, r) for r in lost])
        if problems:
            self.corrupt.inc(len(problems))
            rows = [corruption_row(header.run_id, side, rank, *p) for p in problems]
            yield TABLES, named("corruptions", rows)
        step_events = [i.last_step_event for i in infos if i.last_step_event is not None]
        tensor_steps = [i.last_tensor_step for i in infos if i.last_tensor_step is not None]
        last = infos[-1]
        status = (
            "corrupt"
            if problems or lost or any(i.corrupt for i in infos)
            else "crashed"
            if not last.complete
            else "failed"
            if last.end_status == "failed"
            else "complete"
        )
        info = RankInfo(
            side,
            rank,
            len(infos),
            sum(i.records for i in infos),
            last.complete,
            last.torn_tail,
            max(step_events) if step_events else _last_tensor_step(tensor_steps, finished=status == "complete"),
            lost,
            status,
        )
        yield RANKS, info
        yield TABLES, named("runs", [_run_row(run.path, header, info)])


def _last_tensor_step(steps: list[int], *, finished: bool) -> int | None:
    """The last completed step of a log without ``step`` events, from its tensors' steps: the last one's, or, where
    the training raised or crashed, the one before it, which it left unfinished (None: it failed in its first)."""
    if not steps:
        return None
    last = max(steps) if finished else max(steps) - 1
    return last if last >= 0 else None


def _run_row(path: str, h: RunHeader, info: RankInfo) -> dict[str, Any]:
    as_json = lambda v: json.dumps(v, sort_keys=True, default=repr)  # noqa: E731
    return {
        "run_id": h.run_id,
        "rank": info.rank,
        "path": path,
        "node_label": h.node_label,
        "role": h.role,
        "world_size": h.world_size,
        "schema_version": h.schema_version,
        "config_fingerprint": h.config_fingerprint,
        "seed": h.seed,
        "data_order_fingerprint": h.data_order_fingerprint,
        "fingerprint_algorithm": h.fingerprint_algorithm,
        "device": h.device,
        "created_unix": h.created_unix,
        "config": as_json(h.config),
        "versions": as_json(h.versions),
        "determinism": as_json(h.determinism),
        "extra": as_json(h.extra),
        "segments": info.segments,
        "records": info.records,
        "complete": info.complete,
        "torn_tail": info.torn_tail,
        "last_step": info.last_step,
        "status": info.status,
    }


def lost_row(run_id: str, side: str, rank: int, r: LostRange) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "side": side,
        "rank": rank,
        "path": r.file,
        "offset": r.start,
        "bytes": r.bytes,
        "records": r.records,
        "first_step": r.first_step,
        "last_step": r.last_step,
    }
