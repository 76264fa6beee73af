"""Continue a crashed log: where it stands, for the writer that continues it.

    end = log_end(rank_dir(run, rank))                  # segments, records, last completed step
    resume = Resumption(end.segments, step=10, records=end.records, last_step=end.last_step)
    Tracer(model, optimizer, out=run, run=info, resume=resume)   # or LogWriter(rank_dir(run, rank), header, resume=...)

The writer appends segment files after the last one and never rewrites a byte; its
first segment starts with the ``resume`` marker (`tracer.log.sessions`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from tracer.log.layout import list_segments
from tracer.log.reader import LogReader
from tracer.log.records import EventRecord
from tracer.log.segment import LogStatus, Segment, TornTailWarning, load_segment


@dataclass(frozen=True)
class LogEnd:
    """Where a crashed log stands, for a writer that continues it."""

    segments: int  # the next segment's index
    records: int  # TENSOR and EVENT records the log holds: the next segment's HEADER `first_record`
    last_step: int | None  # the last step whose `step` event the log holds (the step completed)
    complete: bool  # the log has an END record: nothing to resume


def log_end(directory: Path) -> LogEnd:
    """Read a log to its end (skipping corruption, as a crashed log may be torn) and say where it stands."""
    reader = LogReader(directory, on_corruption="skip")
    last_step = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        for rec in reader.records():
            if isinstance(rec, EventRecord) and rec.kind == "step":
                last_step = rec.step if last_step is None else max(last_step, rec.step)
    segments = list_segments(directory)
    return LogEnd(segments[-1][0] + 1, _records(segments), last_step, reader.status.complete)


def _records(segments: list[tuple[int, Path]]) -> int:
    """Records the log holds as its chain counts them: the last segment with a HEADER, its first record plus its
    own (a segment torn inside its HEADER holds none)."""
    for _, path in reversed(segments):
        seg = Segment(load_segment(path), str(path), last=False, skip=True, status=LogStatus())
        for _ in seg.entries:
            pass
        if seg.first_record is not None:
            return seg.first_record + seg.data_records
    return 0
