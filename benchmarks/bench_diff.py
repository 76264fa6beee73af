"""Benchmark the Beam diff against the same diff as one DuckDB SQL join.

    .venv/bin/python benchmarks/bench_diff.py [--events 1000000] [--repeat 10] [beam options]

A synthetic pair of runs, each with at least `--events` TENSOR records written by the
real `tracer.log.LogWriter`, differing from one step on. The Beam job is the whole
`sdc diff` pipeline (`pipelines.beam_job.build_pipeline`: decode the logs, key, join,
diff, derive metrics and detector alarms, write Parquet), run as `sdc diff` runs it
(`pipelines.beam_job.run_job`) on the DirectRunner with the options `sdc diff` would pick
(in_memory at this size), or with the beam options given. The baseline
reads the same records from Parquet (converted beforehand, not timed) and writes the
same per-event diff with one full outer join in DuckDB. After one untimed run of each,
the two alternate `--repeat` times, and the i-th Beam run is paired with the i-th DuckDB
run: Beam / DuckDB is the ratio of mean times with its bootstrap 95 % interval over the
pairs (`intervals.paired_ratio`). Events/s counts both sides' records over the Beam job's
mean time; its interval is that of the mean time (`intervals.mean_interval`), inverted, so
the rate target is met only when the slow end of the interval reaches it. Each run takes
seconds at 1 M events, so the default ten pairs keep the script within about 3 minutes on a
quiet 2-core machine. For comparison the script also times, once each, the Beam job in
multi_processing mode and the decoding of both runs' segments alone
(`tracer.log.read_segment_columns`, which every reader of the log pays).

Targets (issue 32): >= 800 000 events/s, and the Beam job <= 3x the DuckDB time, both on the 95 % interval.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from intervals import Ratio, mean_interval, paired_ratio

from pipelines.arguments import DEFAULT_STEPS_PER_BUCKET, DiffRequest
from pipelines.beam_job import build_pipeline, run_job
from pipelines.log_source import read_file
from pipelines.plan import DiffPlan, plan_diff
from pipelines.runner_options import describe_runner, new_pipeline, pipeline_options
from tracer.log import SCHEMA_VERSION, EventRecord, LogWriter, Phase, RunHeader, TensorRecord, rank_dir
from tracer.log.columns import read_segment_columns

RATE_TARGET = 800_000  # events/s, both sides' records
RATIO_TARGET = 3.0  # Beam / DuckDB time
SITES = [f"layers.{i}.{kind}" for i in range(6) for kind in ("attention", "feed_forward")]
PARAMS = [f"layers.{i}.{p}.weight" for i in range(6) for p in ("wq", "wo", "w1")] + [
    "tok_embeddings.weight",
    "norm.weight",
]
MICROBATCHES = 2
EVENTS_PER_STEP = MICROBATCHES * (1 + 2 * len(SITES)) + 2 * len(PARAMS)
DIVERGE_AT = 0.75  # the suspect's site outputs differ from this fraction of the steps on


def write_run(out: Path, steps: int, suspect: bool) -> None:
    header = RunHeader(
        SCHEMA_VERSION,
        f"bench-{'suspect' if suspect else 'golden'}",
        "bench",
        "train",
        1,
        0,
        {"bench": True},
        "bench-config",
        0,
        "bench-data",
        "lanes64-v1",
        {},
        "cpu",
        {"intra_op_threads": 1},
        0.0,
        {},
    )
    rng = random.Random(0)
    diverge = int(steps * DIVERGE_AT)
    with LogWriter(rank_dir(out, 0), header) as w:
        for step in range(steps):

            def rec(mb: int, name: str, phase: Phase, step: int = step) -> None:
                # stats vary from tensor to tensor, as real ones do (constants would compress to nothing)
                fp, l2, absmax = rng.getrandbits(64), rng.uniform(1.0, 100.0), rng.uniform(0.01, 1.0)
                if suspect and step >= diverge and phase != Phase.INPUT:
                    fp, l2 = fp ^ 1, l2 * (1 + 1e-6)
                w.write_tensor(TensorRecord(step, mb, name, phase, fp, l2, absmax, 0, 0, "float32[8,64,128]"))

            for mb in range(MICROBATCHES):
                rec(mb, "input", Phase.INPUT)
                for site in SITES:
                    rec(mb, site, Phase.FORWARD)
                for site in reversed(SITES):
                    rec(mb, site, Phase.BACKWARD)
            for phase in (Phase.GRAD, Phase.PARAM):
                for name in PARAMS:
                    rec(0, name, phase)
            w.write_event(
                EventRecord(
                    "step", step, {"loss": 5.0 - step * 1e-4, "lr": [1e-3], "wall_s": 0.1, "microbatches": MICROBATCHES}
                )
            )


def to_parquet(run: Path, out: Path) -> None:
    """The same records as a plain table, for DuckDB (not timed)."""
    parts = []
    for seg in sorted(rank_dir(run, 0).glob("*.sdclog")):
        c = read_segment_columns(seg.read_bytes(), str(seg), last=True).tensors
        strings = np.array(c.strings, dtype=object)
        parts.append(
            pa.table(
                {
                    "rank": np.zeros(len(c), np.int32),
                    "step": c.step,
                    "microbatch": c.microbatch,
                    "name": strings[c.name],
                    "phase": c.phase,
                    "fingerprint": c.fingerprint,
                    "l2": c.l2,
                    "absmax": c.absmax,
                    "nan": c.nan,
                    "inf": c.inf,
                    "meta": strings[c.meta],
                    "offset": c.offset,
                }
            )
        )
    pq.write_table(pa.concat_tables(parts), out)


DUCKDB_DIFF = """
COPY (
    SELECT coalesce(g.rank, s.rank) AS rank, coalesce(g.step, s.step) AS step,
           coalesce(g.microbatch, s.microbatch) AS microbatch, coalesce(g.name, s.name) AS name,
           coalesce(g.phase, s.phase) AS phase,
           CASE WHEN g.step IS NULL THEN 'suspect_only' WHEN s.step IS NULL THEN 'golden_only'
                WHEN g.fingerprint = s.fingerprint THEN 'equal' ELSE 'differ' END AS status,
           coalesce(g.fingerprint = s.fingerprint, false) AS equal,
           g.fingerprint AS golden_fingerprint, s.fingerprint AS suspect_fingerprint,
           g.l2 AS golden_l2, s.l2 AS suspect_l2, g.absmax AS golden_absmax, s.absmax AS suspect_absmax,
           g.nan AS golden_nan, s.nan AS suspect_nan, g.inf AS golden_inf, s.inf AS suspect_inf,
           coalesce(g.meta, s.meta) AS meta, g.offset AS golden_offset, s.offset AS suspect_offset
    FROM read_parquet('{golden}') g
    FULL OUTER JOIN read_parquet('{suspect}') s
      USING (rank, step, microbatch, name, phase)
) TO '{out}' (FORMAT parquet)
"""


def bench(events: int, beam_args: list[str], steps_per_bucket: int, repeat: int = 10) -> tuple[Ratio, Ratio]:
    """(events/s, Beam / DuckDB time) of the diff with `beam_args` (default: what `sdc diff` picks), each with its
    interval, from `repeat` alternating runs of each."""
    steps = -(-events // EVENTS_PER_STEP)
    total = 2 * steps * EVENTS_PER_STEP
    with tempfile.TemporaryDirectory(prefix="bench-diff-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        for name in ("golden", "suspect"):
            write_run(root / name, steps, suspect=name == "suspect")
            to_parquet(root / name, root / f"{name}.parquet")
        print(
            f"synthetic pair     : {steps:,} steps x {EVENTS_PER_STEP} tensor records per side "
            f"({total:,} in all), written in {time.perf_counter() - start:.1f} s"
        )
        con = duckdb.connect()
        request = DiffRequest(
            golden=str(root / "golden"),
            suspect=str(root / "suspect"),
            db=root / "unused.duckdb",
            steps_per_bucket=steps_per_bucket,
        )  # the plan reads no --db
        plan = plan_diff(request)
        # One untimed run of each first: a fresh process's first DuckDB query took up to 1.7x its later ones.
        duckdb_diff(con, root)
        beam_diff(con, root, plan, beam_args, "staging-warmup")
        t_duckdb, t_beam = [], []
        for i in range(repeat):
            t_duckdb.append(duckdb_diff(con, root))
            t_beam.append(beam_diff(con, root, plan, beam_args, f"staging{i}"))
        duck, job = mean_interval(t_duckdb), mean_interval(t_beam)
        rate, ratio = events_per_second(total, t_beam), paired_ratio(t_beam, t_duckdb)
        print(f"DuckDB SQL join    : {duck.describe(unit=' s')}, {total / duck.value:,.0f} events/s")
        runner = describe_runner(pipeline_options(beam_args, plan.golden.bytes + plan.suspect.bytes))
        label = f"Beam diff ({runner})" if beam_args else f"Beam diff (sdc diff's default, {runner})"
        print(f"{label}: {job.describe(unit=' s')}")
        print(
            f"  events/s         : {rate.value:,.0f} (95 % CI {rate.low:,.0f}-{rate.high:,.0f}, n={rate.samples}), "
            f"target >= {RATE_TARGET:,}: {'met' if rate.low >= RATE_TARGET else 'NOT met'}"
        )
        print(f"  Beam / DuckDB    : {ratio.describe(RATIO_TARGET)} (run i of each paired)")
        if not beam_args:
            mp = ["--direct_running_mode=multi_processing"]
            t = beam_diff(con, root, plan, mp, "staging-mp")
            print(
                f"  for comparison, {describe_runner(pipeline_options(mp, 0))}: {t:.2f} s ({total / t:,.0f} events/s)"
            )
            t = decode_only(plan)
            print(
                f"  decoding both logs alone (tracer.log.read_segment_columns, part of every job): {t:.2f} s "
                f"({total / t:,.0f} events/s)"
            )
    return rate, ratio


def events_per_second(events: int, seconds: Sequence[float]) -> Ratio:
    """``events`` over the mean of ``seconds``, with the interval of the mean time inverted: ``low`` is the rate
    at the interval's slow end, so a rate target is met only when ``low`` reaches it."""
    t = mean_interval(seconds)
    return Ratio(events / t.value, events / t.high, events / t.low, t.samples)


def duckdb_diff(con: duckdb.DuckDBPyConnection, root: Path) -> float:
    start = time.perf_counter()
    con.execute(
        DUCKDB_DIFF.format(
            golden=root / "golden.parquet", suspect=root / "suspect.parquet", out=root / "duckdb_diff.parquet"
        )
    )
    return time.perf_counter() - start


def beam_diff(con: duckdb.DuckDBPyConnection, root: Path, plan: DiffPlan, beam_args: list[str], staging: str) -> float:
    """Seconds of the whole Beam job, after checking that its event_diffs agree with DuckDB's."""
    opts = pipeline_options(beam_args, plan.golden.bytes + plan.suspect.bytes)
    # `sdc diff` runs one job in a fresh process. Here the jobs share one, and the last job's survivors would make
    # the collector walk the whole heap while this one builds its pipeline (0.1 s), which a fresh process never does.
    gc.collect()
    start = time.perf_counter()
    p = new_pipeline(opts)
    build_pipeline(p, plan, str(root / staging))
    run_job(p)
    seconds = time.perf_counter() - start
    beam_rows, duck_rows = (
        con.execute(
            "SELECT count(*), count(*) FILTER (NOT equal), "
            "sum(hash(step, name, golden_fingerprint, suspect_fingerprint, "
            f"golden_l2, suspect_l2)) FROM '{path}'"
        ).fetchall()[0]
        for path in (root / staging / "event_diffs" / "*.parquet", root / "duckdb_diff.parquet")
    )
    if beam_rows != duck_rows:
        raise SystemExit(f"the diffs disagree: Beam (rows, differing, checksum) {beam_rows}, DuckDB {duck_rows}")
    return seconds


def decode_only(plan: DiffPlan) -> float:
    """Seconds to read and decode both runs' segments, one after the other, as the Beam job's workers do."""
    start = time.perf_counter()
    for run in (plan.golden, plan.suspect):
        for rank in run.ranks.values():
            for index, path in rank.segments:
                read_segment_columns(read_file(path), path, last=index == rank.segments[-1][0], on_corruption="skip")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000, help="tensor records per side (default 1 000 000)")
    p.add_argument("--steps-per-bucket", type=int, default=DEFAULT_STEPS_PER_BUCKET)
    p.add_argument(
        "--repeat",
        type=int,
        default=10,
        help="alternating runs of each diff, paired run by run (default 10; two or more)",
    )
    args, beam_args = p.parse_known_args(argv)
    bench(args.events, beam_args, args.steps_per_bucket, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
