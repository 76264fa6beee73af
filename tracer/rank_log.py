"""Open and close the log one Tracer writes for its rank: the I/O thread, the run's writer lock and the log file.

    io, log, lock = open_rank_log(out, rank, header, options, resume)     # entering the Tracer
    close_rank_log(log, io, exc, resume, rank)                           # leaving it

Rank 0 holds the run's writer lock while it records (the one its process or launcher holds already, as under
`sdc record`), so `sdc watch` tells a crashed writer from a slow one, also in a user's own script or torchrun job.
The header is written at the first flush (the end of the first step), so that it can name the sites found at their
first forward to give no input gradient. A log left by a failure is closed as failed, or, for a failed resumption or
a failure for lack of space (a full file system, a file-size limit: `tracer.full_disk`), left resumable
(`tracer.log.sessions`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tracer.full_disk import full_disk_reason
from tracer.io_thread import AsyncFile, IOThread
from tracer.log import rank_dir
from tracer.log.records import RunHeader
from tracer.log.runlock import RunLock
from tracer.log.sessions import NO_SPACE, Resumption, abandon_failed
from tracer.log.writer import HeaderAtFirstFlush
from tracer.options import TraceOptions
from tracer.record_buffer import RecordSink


def open_rank_log(
    out: Path, rank: int, header: Callable[[], RunHeader], options: TraceOptions, resume: Resumption | None
) -> tuple[IOThread, RecordSink, RunLock | None]:
    """(the I/O thread, the log writing through it, rank 0's writer lock) of ``out/rank-NNNNN``; nothing is left
    running or held when it raises."""
    io = IOThread(max_pending=options.max_pending_chunks)
    lock = None
    try:
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            lock = RunLock.ensure(out)
        log = HeaderAtFirstFlush(
            rank_dir(out, rank),
            header,
            segment_bytes=options.segment_bytes,
            open_file=lambda path: AsyncFile(path, io),
            resume=resume,
        )
    except BaseException:
        io.stop()
        if lock is not None:
            lock.release()
        raise
    return io, log, lock


def close_rank_log(
    log: RecordSink,
    io: IOThread | None,
    exc: BaseException | None,
    resume: Resumption | None,
    rank: int,
    step: int = -1,
) -> None:
    """Close ``log`` complete, or after ``exc`` failed in ``step`` (a failed resumption, or any session that ran out of
    space, stays resumable), and stop ``io``. After a failure the training error stays the one the user sees: a
    writer failure here is secondary and dropped."""
    if exc is None:
        log.close("complete")
        if io is not None:
            io.stop()
        return
    try:
        if isinstance(log, HeaderAtFirstFlush) and resume is not None:  # a log open_rank_log opened, resumed
            abandon_failed(log, resume.step, rank, exc)
        elif isinstance(log, HeaderAtFirstFlush) and full_disk_reason(exc) is not None:
            abandon_failed(log, max(step, 0), rank, exc, NO_SPACE)
        else:
            log.close("failed", f"{type(exc).__name__}: {exc}")
        if io is not None:
            io.stop()
    except Exception:
        pass
