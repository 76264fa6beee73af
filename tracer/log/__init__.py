"""The crash-safe, append-only event log: one directory of segments per rank.

    from tracer.log import LogWriter, LogReader, rank_dir
    with LogWriter(rank_dir(run, rank), header) as w:
        w.write_tensor(TensorRecord(...))
    for rec in LogReader(rank_dir(run, rank)).records(): ...
    for item in LogFollower(rank_dir(run, rank)).follow(idle_timeout_s=60): ...   # while it is written
    cols = read_segment_columns(data, name, last=...)   # one segment, as arrays: parallel readers

docs/log-format.md is the byte-level specification.
"""

from tracer.log.claim import claim_out_dir
from tracer.log.columns import (
    SegmentColumns,
    SegmentSummary,
    TensorColumns,
    chain_lost,
    check_chain,
    read_segment_columns,
)
from tracer.log.follow import LogFollower, Resumed
from tracer.log.framing import FORMAT_VERSION, RecordType
from tracer.log.layout import SEGMENT_GLOB, list_ranks, parse_segment_path, rank_dir, rank_dir_name, segment_name
from tracer.log.reader import LogReader, find_sessions, read_segment, resumption_in
from tracer.log.records import NO_MICROBATCH, SCHEMA_VERSION, EndRecord, EventRecord, Phase, RunHeader, TensorRecord
from tracer.log.runlock import RunLock
from tracer.log.segment import Entry, LogStatus, LostRange, TornTailWarning
from tracer.log.sessions import Resumption, Sessions
from tracer.log.writer import LogWriter

__all__ = [
    "FORMAT_VERSION",
    "NO_MICROBATCH",
    "SCHEMA_VERSION",
    "EndRecord",
    "Entry",
    "EventRecord",
    "LogFollower",
    "LogReader",
    "LogStatus",
    "LostRange",
    "LogWriter",
    "Phase",
    "RecordType",
    "Resumed",
    "Resumption",
    "RunHeader",
    "RunLock",
    "SEGMENT_GLOB",
    "SegmentColumns",
    "Sessions",
    "SegmentSummary",
    "TensorColumns",
    "TensorRecord",
    "TornTailWarning",
    "chain_lost",
    "check_chain",
    "claim_out_dir",
    "find_sessions",
    "list_ranks",
    "parse_segment_path",
    "rank_dir",
    "rank_dir_name",
    "read_segment",
    "read_segment_columns",
    "resumption_in",
    "segment_name",
]
