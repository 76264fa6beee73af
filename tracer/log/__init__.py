"""The crash-safe, append-only event log: one directory of segments per rank.

    from tracer.log import LogWriter, LogReader, rank_dir
    with LogWriter(rank_dir(run, rank), header) as w:
        w.write_tensor(TensorRecord(...))
    for rec in LogReader(rank_dir(run, rank)).records(): ...
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
from tracer.log.framing import FORMAT_VERSION, RecordType
from tracer.log.layout import SEGMENT_GLOB, list_ranks, parse_segment_path, rank_dir, rank_dir_name, segment_name
from tracer.log.reader import Entry, LogReader, LogStatus, LostRange, TornTailWarning, read_segment
from tracer.log.records import SCHEMA_VERSION, EndRecord, EventRecord, Phase, RunHeader, TensorRecord
from tracer.log.runlock import RunLock
from tracer.log.writer import LogWriter

__all__ = [
    "FORMAT_VERSION",
    "SCHEMA_VERSION",
    "EndRecord",
    "Entry",
    "EventRecord",
    "LogReader",
    "LogStatus",
    "LostRange",
    "LogWriter",
    "Phase",
    "RecordType",
    "RunHeader",
    "RunLock",
    "SEGMENT_GLOB",
    "SegmentColumns",
    "SegmentSummary",
    "TensorColumns",
    "TensorRecord",
    "TornTailWarning",
    "chain_lost",
    "check_chain",
    "claim_out_dir",
    "list_ranks",
    "parse_segment_path",
    "rank_dir",
    "rank_dir_name",
    "read_segment",
    "read_segment_columns",
    "segment_name",
]
