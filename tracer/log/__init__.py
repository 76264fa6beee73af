"""The crash-safe, append-only event log: one directory of segments per rank.

    from tracer.log import LogWriter, LogReader, rank_dir
    with LogWriter(rank_dir(run, rank), header) as w:
        w.write_tensor(TensorRecord(...))
    for rec in LogReader(rank_dir(run, rank)).records(): ...

docs/log-format.md is the byte-level specification.
"""

from tracer.log.framing import FORMAT_VERSION, RecordType
from tracer.log.layout import list_ranks, rank_dir
from tracer.log.reader import Entry, LogReader, LogStatus, TornTailWarning, read_segment
from tracer.log.records import SCHEMA_VERSION, EndRecord, EventRecord, Phase, RunHeader, TensorRecord
from tracer.log.writer import LogWriter

__all__ = [
    "FORMAT_VERSION",
    "SCHEMA_VERSION",
    "EndRecord",
    "Entry",
    "EventRecord",
    "LogReader",
    "LogStatus",
    "LogWriter",
    "Phase",
    "RecordType",
    "RunHeader",
    "TensorRecord",
    "TornTailWarning",
    "list_ranks",
    "rank_dir",
    "read_segment",
]
