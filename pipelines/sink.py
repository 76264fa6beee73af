"""Write every output table of the job through one Parquet sink.

Beam's own Parquet sink is one transform per table, five stages each: with fifteen
tables that was most of a small job's time. Here all tables share one sink. Each
bundle writes one file per table it sees under ``<staging>/_tmp``, where the rows are
produced; the files move to ``<staging>/<table>/`` only after the runner has committed
the bundles that wrote them (their names reach the last step only then), so a retried
bundle leaves no duplicate rows, as with Beam's FileBasedSink. A file's name is emitted
when it is opened, not from ``finish_bundle`` (which closes it): the DaskRunner (Beam
2.77) drops what ``finish_bundle`` emits. Small tables (a bucket's rows) are gathered per file into row
groups of about `ROW_GROUP_ROWS` before they are written: a row group per small table cost more than
the rows themselves, and DuckDB loads row groups of 32 Ki rows faster than larger ones (0.62 s against
0.83 s for 1 M rows here). Staging Parquet carries no column statistics: it is only ever loaded whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

TMP = "_tmp"
ROW_GROUP_ROWS = 1 << 15  # rows held per open file before they are written: bounds a bundle's memory


class WriteTables(beam.PTransform):
    """PCollections of (table name, pa.Table) -> ``<staging>/<name>/*.parquet``; outputs the final paths.

    Each input is written where it is produced (no Flatten in front, which a runner may
    not fuse: the tables would cross between stages once more); only file names meet.
    Inputs of a few rows are best flattened by the caller first: a writing step per input
    costs a local runner more than moving those rows.
    """

    def __init__(self, staging: str, schemas: Mapping[str, pa.Schema]) -> None:
        super().__init__()
        self.staging, self.schemas = staging, dict(schemas)

    def expand(self, parts: Sequence[beam.PCollection]) -> beam.PCollection:
        written = [
            part | f"Write files {i}" >> beam.ParDo(_WriteFiles(self.staging, self.schemas))
            for i, part in enumerate(parts)
        ]
        return (
            tuple(written)
            | "All files" >> beam.Flatten()
            | "Committed files" >> beam.GroupByKey()
            | "Move into place" >> beam.FlatMap(_move_into_place, self.staging)
        )


class _WriteFiles(beam.DoFn):
    """(table name, pa.Table) -> rows appended to this bundle's file of that table; emits (None, (table, path))
    once, keyed for the one group of every file written."""

    def __init__(self, staging: str, schemas: dict[str, pa.Schema]) -> None:
        self.staging, self.schemas = staging, schemas

    def start_bundle(self) -> None:
        self.open: dict[str, tuple[Any, pq.ParquetWriter]] = {}
        self.pending: dict[str, list[pa.Table]] = {}  # per open file: tables not written yet
        self.rows: dict[str, int] = {}

    def process(self, element: tuple[str, pa.Table]) -> Iterator[tuple[None, tuple[str, str]]]:
        name, table = element
        schema = self.schemas[name]
        if name not in self.open:
            path = FileSystems.join(self.staging, TMP, f"{name}-{uuid.uuid4().hex}.parquet")
            f = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
            strings = [fl.name for fl in schema if pa.types.is_dictionary(fl.type) or pa.types.is_string(fl.type)]
            # Dictionary-encode only strings: on random fingerprints it costs time and saves nothing. Version 2 data
            # pages written 64 Ki values at a time encode the benchmark's 1 M diff rows in 0.11 s instead of 0.15 s.
            writer = pq.ParquetWriter(
                f,
                schema,
                compression="snappy",
                use_dictionary=strings,
                write_statistics=False,
                data_page_version="2.0",
                write_batch_size=1 << 16,
            )
            self.open[name] = f, writer
            self.pending[name], self.rows[name] = [], 0
            yield None, (name, path)
        if not table.schema.equals(schema):
            table = table.cast(schema)  # e.g. a dictionary column whose values came out plain
        self.pending[name].append(table)
        self.rows[name] += table.num_rows
        if self.rows[name] >= ROW_GROUP_ROWS:
            self._flush(name)

    def _flush(self, name: str) -> None:
        if self.pending[name]:
            self.open[name][1].write_table(pa.concat_tables(self.pending[name]))
            self.pending[name], self.rows[name] = [], 0

    def finish_bundle(self) -> None:
        for name, (f, writer) in self.open.items():
            self._flush(name)
            writer.close()
            f.close()
        self.open, self.pending, self.rows = {}, {}, {}


def _move_into_place(grouped: tuple[None, Iterable[tuple[str, str]]], staging: str) -> Iterator[str]:
    written = list(grouped[1])
    for name in sorted({name for name, _ in written}):
        _mkdirs(FileSystems.join(staging, name))
    sources = [path for _, path in written]
    targets = [FileSystems.join(staging, name, path.rsplit("/", 1)[-1]) for name, path in written]
    if sources:
        FileSystems.rename(sources, targets)
    tmp = FileSystems.join(staging, TMP)
    if FileSystems.exists(tmp):
        FileSystems.delete([tmp])  # files of bundles that failed and were retried
    yield from targets


def write_table(staging: str, name: str, table: pa.Table) -> str:
    """A table the launcher knows without the job (the pair's own row) written beside the job's:
    ``<staging>/<name>/<name>.parquet``. A step of the job for one row would cost it milliseconds."""
    folder = FileSystems.join(staging, name)
    _mkdirs(folder)
    path = FileSystems.join(folder, f"{name}.parquet")
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        pq.write_table(table, f)
    return path


def _mkdirs(path: str) -> None:
    try:
        FileSystems.mkdirs(path)
    except OSError:  # exists already (object stores have no directories: a no-op there)
        pass
