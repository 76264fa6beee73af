"""Diff a golden and a suspect run (and replay logs) into a DuckDB study database.

    python -m pipelines.run --golden runs/A --suspect runs/B [--replay runs/R ...] --db study.duckdb [beam options]
    sdc diff --golden runs/A --suspect runs/B --db study.duckdb [-- beam options]

Stages (docs/pipelines.md): parse (describe the runs, read their headers) -> pair
(validate, fail listing every differing field) -> key -> join -> diff (the Beam
job: `pipelines.source`, `pipelines.diff`, `pipelines.metrics`,
`pipelines.detections`) -> write (Parquet in a staging directory, then
`analysis.load` into DuckDB in one transaction).

Options this module does not define pass through to Beam (``--runner``,
``--direct_num_workers``, ``--dask_client_address``, ...). Without ``--runner`` the
job runs on Beam's FnApiRunner, in this process below `IN_MEMORY_BYTES` of logs, else
in a worker process per core (`pipeline_options`).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import PipelineResult, PipelineState, create_runner
from apache_beam.runners.worker import statesampler

from analysis import queries
from analysis.load import connect_writable, load_parquet
from pipelines import alarms, detections, metrics, source
from pipelines import diff as tensor_diff
from pipelines import events as events_mod
from pipelines.arguments import DEFAULT_STEPS_PER_BUCKET, DiffRequest, add_arguments
from pipelines.pairing import BOUNDS, LOST, ComparisonBounds, pair_id, validate_pair
from pipelines.sink import WriteTables, write_table
from pipelines.source import EVENTS, SEGMENTS, TENSORS, RunLayout
from pipelines.tables import SCHEMAS, TABLES, table
from tracer.checkpoint import checkpoint_files
from tracer.errors import LogCorruptionError, LogFormatError, SdcError, UsageError

# Below this much log data the in_memory mode wins: multi_processing pays for worker start-up and moves
# every shuffled batch between processes (2M records on 2 cores: 2.2 s vs 6.2-9.0 s).
IN_MEMORY_BYTES = 1 << 30
# The engine the DirectRunner runs a batch job on. Named directly, because Beam 2.77's DirectRunner first tries
# the Prism runner, downloading its binary from GitHub: offline that fails after a connection attempt and falls
# back here (0.2 s of a 2 s job); online the job would run on a runner nothing here tests.
DEFAULT_RUNNER = "FnApiRunner"
HEARTBEAT_S = 15.0
Echo = Callable[[str], None]


@dataclass(frozen=True)
class DiffPlan:
    """Everything the job needs, decided on the launcher before it starts."""

    golden: RunLayout
    suspect: RunLayout
    replays: tuple[RunLayout, ...]
    pair_id: str
    steps_per_bucket: int
    drift: tuple[metrics.DriftTask, ...]
    twin: RunLayout | None = None
    baseline: bool = False  # the suspect is golden's pretraining shuffle-seed twin (pipelines.pairing)

    def sides(self) -> dict[str, RunLayout]:
        return {"golden": self.golden, "suspect": self.suspect,
                **({source.TWIN: self.twin} if self.twin is not None else {}),
                **{f"replay{i}": r for i, r in enumerate(self.replays)}}

    def run_ids(self) -> dict[tuple[str, int], str]:
        return {(side, rank): r.header.run_id for side, run in self.sides().items() for rank, r in run.ranks.items()}


@dataclass
class DiffReport:
    pair_id: str
    staging: str
    rows: dict[str, int] = field(default_factory=dict)  # loaded rows per table
    counters: dict[str, int] = field(default_factory=dict)  # Beam metrics, where the runner reports them
    pipeline_s: float = 0.0


def plan_diff(golden: str, suspect: str, replays: Sequence[str] = (), steps_per_bucket: int = DEFAULT_STEPS_PER_BUCKET,
              twin: str | None = None, baseline: bool = False) -> DiffPlan:
    """Describe the runs, validate the pair (and twin) and find the checkpoints both hold."""
    if steps_per_bucket < 1:
        raise UsageError(f"--steps-per-bucket must be >= 1, got {steps_per_bucket}")
    g, s = source.describe_run(golden), source.describe_run(suspect)
    rs = tuple(source.describe_run(r) for r in replays)
    t = source.describe_run(twin) if twin is not None else None
    validate_pair(g, s, rs, t, baseline=baseline)
    g_ckpt, s_ckpt = source.list_checkpoints(golden), source.list_checkpoints(suspect)
    tasks = []
    for rank in sorted(g.ranks):
        for step in sorted(g_ckpt.get(rank, set()) & s_ckpt.get(rank, set())):
            rel = checkpoint_files(step, rank)
            tasks.append(metrics.DriftTask(
                rank, step, tuple(_join(golden, f) for f in rel), tuple(_join(suspect, f) for f in rel),
                (g.ranks[rank].header.run_id, s.ranks[rank].header.run_id),
            ))
    return DiffPlan(g, s, rs, pair_id(g, s), steps_per_bucket, tuple(tasks), t, baseline)


def _join(run: str, relpath: str) -> str:
    return FileSystems.join(run, *relpath.split("/"))


def build_pipeline(p: beam.Pipeline, plan: DiffPlan, staging: str) -> None:
    """Wire the whole job: read every run, diff, derive metrics, write one Parquet table per output (all but
    ``pairs``, the plan's own row, which `diff` writes beside them)."""
    sides = plan.sides()
    spread = not in_process(p.options)
    read = p | "Read runs" >> source.ReadRuns(sides, plan.steps_per_bucket, spread)
    ranks = read[SEGMENTS] | "Summarise ranks" >> source.SummariseRanks(sides)
    bounds = ranks[source.RANKS] | "Compared steps" >> ComparisonBounds(plan.run_ids())
    events = read[EVENTS] | "Route events" >> events_mod.RouteEvents(plan.run_ids())
    faults = events[events_mod.FAULTS]
    diffs = read[TENSORS] | "Diff tensors" >> tensor_diff.DiffTensors(bounds[BOUNDS], faults, bounds[LOST])
    small = (
        read[TABLES],
        ranks[TABLES],
        bounds[TABLES],
        events[TABLES],
        diffs[tensor_diff.FINDINGS] | "Rank findings" >> detections.RankFindings(faults, events[events_mod.CHECKS]),
        events[events_mod.STEPS] | "Loss curves" >> metrics.LossCurves(),
        *([p | "Parameter drift" >> metrics.ParamDrift(plan.drift, spread)] if plan.drift else []),
        read[source.EVIDENCE] | "Detector alarms" >> alarms.DetectorAlarms(plan.suspect),
    )
    # The diff tables are written where they are made; the others, a few rows per rank or segment, meet first:
    # one writing step for all of them costs less than a step each.
    tables = (diffs[TABLES], small | "Small tables" >> beam.Flatten())
    _ = tables | "Write tables" >> WriteTables(staging, SCHEMAS)


def _pair_row(plan: DiffPlan) -> dict[str, Any]:
    return {
        "golden_path": plan.golden.path, "suspect_path": plan.suspect.path,
        "golden_run_id": plan.golden.header.run_id, "suspect_run_id": plan.suspect.header.run_id,
        "replay_paths": [r.path for r in plan.replays], "replay_run_ids": [r.header.run_id for r in plan.replays],
        "twin_run_id": plan.twin.header.run_id if plan.twin is not None else None,
        "baseline": plan.baseline,
        "world_size": plan.golden.header.world_size, "ranks": len(plan.golden.ranks),
        "steps_per_bucket": plan.steps_per_bucket, "created_unix": time.time(),
        "sdctrace_version": _version(),
    }


def _version() -> str:
    try:
        return metadata.version("sdctrace")
    except metadata.PackageNotFoundError:
        return "unknown"


def pipeline_options(beam_args: Sequence[str], input_bytes: int) -> PipelineOptions:
    """Beam options from the pass-through arguments. Without --runner: `DEFAULT_RUNNER`, in_memory below
    `IN_MEMORY_BYTES` of log segments, else multi_processing with one worker per CPU."""
    args = list(beam_args)
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    if PipelineOptions(args).view_as(StandardOptions).runner is None:
        mode = PipelineOptions(args).view_as(DirectOptions).direct_running_mode if "--direct_running_mode" in given \
            else "in_memory" if input_bytes < IN_MEMORY_BYTES else "multi_processing"
        defaults = [f"--runner={DEFAULT_RUNNER}", f"--direct_running_mode={mode}"]
        if "--direct_num_workers" not in given and mode != "in_memory":
            defaults.append("--direct_num_workers=0")  # 0: one worker per CPU
        args = defaults + args
    runner = PipelineOptions(args).view_as(StandardOptions).runner
    try:
        create_runner(runner)
    except (ValueError, ImportError) as exc:
        raise UsageError(
            f"Beam option --runner {runner}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; "
            "give a runner Beam knows (DirectRunner, or a module path such as "
            "apache_beam.runners.dask.dask_runner.DaskRunner) after `--`"
        ) from None
    if "--default_sdk_harness_log_level" not in given:
        args.append("--default_sdk_harness_log_level=WARNING")  # workers' INFO lines would drown the progress
    return PipelineOptions(args)


def new_pipeline(opts: PipelineOptions) -> beam.Pipeline:
    """A pipeline on the runner ``opts`` name. The FnApiRunner also gets the options for its workers, as the
    DirectRunner hands them over: without them a worker process logs at INFO whatever was asked."""
    if _runner_name(opts) != "FnApiRunner":
        return beam.Pipeline(options=opts)
    encoded = JobServiceHandle.encode_pipeline_options(opts.get_all_options())
    provision = beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    return beam.Pipeline(runner=fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(provision)),
                         options=opts)


def _runner_name(opts: PipelineOptions) -> str:
    return (opts.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]


_LOCAL = ("FnApiRunner", "DirectRunner")  # runners that honour --direct_running_mode


def in_process(opts: PipelineOptions) -> bool:
    """Whether the job runs in this one process (in_memory): one worker, nothing to spread."""
    return _runner_name(opts) in _LOCAL and opts.view_as(DirectOptions).direct_running_mode == "in_memory"


def describe_runner(opts: PipelineOptions) -> str:
    runner = _runner_name(opts)
    if runner not in _LOCAL:
        return runner
    d = opts.view_as(DirectOptions)
    if d.direct_running_mode == "in_memory":
        return f"{runner} (in_memory)"
    return f"{runner} ({d.direct_running_mode}, {d.direct_num_workers or os.cpu_count()} workers)"


def diff(request: DiffRequest, echo: Echo = print) -> DiffReport:
    """`sdc diff`: plan, run the Beam job, check what it found, load into DuckDB, summarise."""
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    echo("reading run headers ...")
    plan = plan_diff(request.golden, request.suspect, request.replays, request.steps_per_bucket, request.twin,
                     request.baseline)
    for side, run in plan.sides().items():
        h = run.header
        segments = sum(len(r.segments) for r in run.ranks.values())
        echo(f"  {side:<8} {run.path}: run {h.run_id[:12]}, node {h.node_label!r}, role {h.role}, "
             f"{len(run.ranks)} rank(s), {segments} segment(s)")
    h = plan.golden.header
    match = "baseline pair, data order differs" if plan.baseline else "headers match"
    echo(f"[1/3] pair {plan.pair_id}: {match} (config {h.config_fingerprint[:12]}, seed {h.seed}, "
         f"world size {h.world_size}); {len(plan.drift)} checkpoint pair(s) for drift")
    opts = pipeline_options(request.beam_args, sum(run.bytes for run in plan.sides().values()))
    keep = request.staging is not None
    if keep and FileSystems.match([FileSystems.join(request.staging, "**")])[0].metadata_list:
        raise UsageError(f"--staging {request.staging}: not empty; give an empty or new directory (all its "
                         "Parquet is loaded as this pair's)")
    request.db.resolve().parent.mkdir(parents=True, exist_ok=True)
    created = not request.db.exists()
    connect_writable(request.db).close()  # a bad or locked --db fails now, not after the Beam job
    staging = request.staging or scratch_dir(request.db.resolve().parent, "staging")
    report = DiffReport(plan.pair_id, staging)
    try:
        echo(f"[2/3] Beam job on {describe_runner(opts)}, Parquet to {staging} ...")
        start = time.perf_counter()
        with _heartbeat(echo, start), _beam_temp():
            p = new_pipeline(opts)
            build_pipeline(p, plan, staging)
            result, state = run_job(p)
        report.pipeline_s = time.perf_counter() - start
        if state != PipelineState.DONE:
            raise SdcError(f"the Beam job ended in state {state}; see the runner's log")
        write_table(staging, "pairs", table("pairs", [_pair_row(plan)]))
        report.counters = c = _counters(result)
        counts = (f": {c.get('segments_read', 0)} segment(s), {c.get('tensor_records', 0):,} tensor records, "
                  f"{c.get('events_compared', 0):,} events compared") if c else " (this runner reports no metrics)"
        echo(f"      done in {report.pipeline_s:.1f} s{counts}")
        with _local(staging) as local:
            _check_problems(local, request.skip_corrupt, echo)
            _report_runs(local, plan, echo)
            echo(f"[3/3] loading into {request.db} ...")
            report.rows = load_parquet(request.db, local, plan.pair_id)
    except BaseException:
        if created:  # the early check made an empty database: a failed diff leaves none
            for path in (request.db, request.db.with_name(request.db.name + ".wal")):
                path.unlink(missing_ok=True)
        raise
    finally:
        if not keep:
            shutil.rmtree(staging, ignore_errors=True)
    for line in summarize(request.db, plan.pair_id):
        echo(line)
    return report


def run_job(p: beam.Pipeline) -> tuple[PipelineResult, str]:
    """Run a built job to its end: its result and final state. Two costs of an in-process runner (in_memory) are
    cut meanwhile, each measured on the benchmark pair (benchmarks/bench_diff.py):

    - the objects alive before the job are kept out of the garbage collector's way (`gc.freeze`): each full
      collection walked every object this process holds, Beam's, pyarrow's and torch's modules included
      (0.7 s of a 4.5 s job);
    - the state sampler wakes at least every `SAMPLING_PERIOD_MS` (`_prompt_state_sampler`)."""
    gc.freeze()
    try:
        with _prompt_state_sampler():
            result = p.run()
            state = result.wait_until_finish()
    finally:
        gc.unfreeze()
    if hasattr(result, "client"):
        result.client.close()  # the DaskRunner leaves its Dask client open
    return result, state


SAMPLING_PERIOD_MS = 5


@contextmanager
def _prompt_state_sampler() -> Iterator[None]:
    """Beam's bundle processor ends every bundle by joining its state-sampling thread, which sleeps between samples
    for up to 200 ms (`statesampler.DEFAULT_SAMPLING_PERIOD_MS`, bound as the constructor's default): 0.08-0.24 s
    of waiting in a 2 s job, 0.1 s of its median time. A shorter longest sleep makes the join prompt; the thread
    samples in C without the GIL, so waking every few milliseconds costs nothing measurable. Left alone if a
    Beam version builds its sampler differently (tests/pipelines/test_units.py pins the one we know)."""
    init = statesampler.StateSampler.__init__
    saved = init.__defaults__
    if saved != (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
        yield
        return
    init.__defaults__ = (SAMPLING_PERIOD_MS,)
    try:
        yield
    finally:
        init.__defaults__ = saved


SCRATCH_PREFIX = ".sdc-diff-"  # + purpose-pid-random: what a diff leaves behind if it is killed


def scratch_dir(parent: Path, purpose: str) -> str:
    """A new folder of this diff's in ``parent``, after removing those that killed diffs left there (their
    process is gone). Only folders named by this function are ever removed."""
    for old in parent.glob(f"{SCRATCH_PREFIX}*-*-*"):
        pid = old.name.removeprefix(SCRATCH_PREFIX).split("-")[1]
        if pid.isdigit() and not _alive(int(pid)) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{purpose}-{os.getpid()}-", dir=parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _beam_temp() -> Iterator[None]:
    """Beam's local runners make temporary folders they never remove (three empty ones per job): give them
    one of ours for the job, removed afterwards (or by the next diff, if this one is killed)."""
    folder = scratch_dir(Path(tempfile.gettempdir()), "beam")
    saved_env, saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield
    finally:
        tempfile.tempdir = saved
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _heartbeat(echo: Echo, start: float) -> Iterator[None]:
    """A line every HEARTBEAT_S while the runner works: Beam's own logs stay at WARNING."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            echo(f"      ... running, {time.perf_counter() - start:.0f} s")

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


def _counters(result: Any) -> dict[str, int]:
    try:
        found = result.metrics().query()["counters"]
    except Exception:  # noqa: BLE001 - runners that do not report metrics
        return {}
    out: dict[str, int] = {}
    for c in found:
        if c.key.metric.namespace == source.NAMESPACE:
            value = c.committed if c.committed is not None else c.attempted
            out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    return out


@contextmanager
def _local(staging: str) -> Iterator[Path]:
    """The staging directory on this machine: itself if local, else a downloaded copy."""
    if Path(staging).is_dir():
        yield Path(staging)
        return
    with tempfile.TemporaryDirectory(prefix="sdc-staging-") as tmp:
        for m in FileSystems.match([FileSystems.join(staging, "*", "*.parquet")])[0].metadata_list:
            table_name, file_name = m.path.rstrip("/").split("/")[-2:]
            (Path(tmp) / table_name).mkdir(exist_ok=True)
            with FileSystems.open(m.path) as src, open(Path(tmp) / table_name / file_name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        yield Path(tmp)


def _check_problems(staging: Path, skip_corrupt: bool, echo: Echo) -> None:
    """Unreadable files always fail the diff; corruption fails it unless --skip-corrupt."""
    errors = _read(staging, "errors")
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise LogFormatError(f"{errors[0]['message']}{more}")
    corrupt = _read(staging, "corruptions")
    if corrupt and not skip_corrupt:
        first = corrupt[0]
        more = f"; {len(corrupt) - 1} more corrupt region(s) in {', '.join(sorted({c['path'] for c in corrupt}))}" \
            if len(corrupt) > 1 else ""
        raise LogCorruptionError(first["path"], first["offset"], first["reason"] + more)
    for c in corrupt:
        echo(f"  warning: skipped corrupt data in {c['path']} at byte {c['offset']}: {c['reason']}")


def _report_runs(staging: Path, plan: DiffPlan, echo: Echo) -> None:
    """One line per rank of a run that did not close cleanly: crashed, failed, or read past corruption."""
    sides = {run_id: side for (side, _), run_id in plan.run_ids().items()}
    lost: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in _read(staging, "lost_ranges"):
        lost.setdefault((r["run_id"], r["rank"]), []).append(r)
    for r in sorted(_read(staging, "runs"), key=lambda r: (sides.get(r["run_id"], ""), r["rank"])):
        side, status = sides.get(r["run_id"], "run"), r["status"]
        where = f"{side} run {r['path']} rank {r['rank']}"
        step = "no step" if r["last_step"] is None else f"step {r['last_step']}"
        if status == "crashed":
            echo(f"  warning: {where} crashed at {step}: no END record (its records stop there)")
        elif status == "failed":
            echo(f"  warning: {where} failed at {step}: training raised, the log was closed")
        elif status == "corrupt":
            ranges = lost.get((r["run_id"], r["rank"]), [])
            steps = ", ".join(f"{'?' if x['first_step'] is None else x['first_step']}.."
                              f"{'end' if x['last_step'] is None else x['last_step']}" for x in ranges)
            echo(f"  warning: {where} is corrupt: at least {sum(x['records'] for x in ranges)} records lost, "
                 f"steps {steps or 'none'} unknown (not compared as differences)")


def _read(staging: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted((staging / name).glob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return sorted(rows, key=lambda r: (r["path"], r.get("offset") or 0))


def summarize(db: str | Path, pid: str) -> list[str]:
    """A few lines on what the pair's tables say, from the named queries (the database opened read-only)."""
    (totals,) = _pair_rows(db, "summary_totals", pid)
    result = (f"result: {totals['events_compared']:,} events compared through step {totals['compared_through']}; "
              f"{totals['events_differing']:,} differ")
    lines = [result]
    if totals["lost_steps"]:
        lines.append(f"  {totals['lost_steps']} compared step(s) lost to corruption (golden {totals['golden_status']}, "
                     f"suspect {totals['suspect_status']}): no divergence is reported there; see table lost_ranges")
    elif (totals["golden_status"], totals["suspect_status"]) != ("complete", "complete"):
        lines.append(f"  runs: golden {totals['golden_status']}, suspect {totals['suspect_status']}")
    firsts = _pair_rows(db, "rq1_first_divergence_by_rank", pid)  # in execution order across ranks
    for r in firsts:
        order = "" if len(firsts) == 1 else " (went first)" if r["went_first"] else f" (#{r['divergence_order']})"
        mb = "the whole step" if r["microbatch"] is None else f"microbatch {r['microbatch']}"
        lines.append(f"  first divergence: rank {r['rank']}{order}, step {r['step']}, {mb}, {r['phase']} {r['name']}")
    drift, spikes = totals["max_drift"], totals["loss_spikes"]
    lines.append(f"  max parameter drift {drift:.3g}; {spikes} loss spike(s)" if drift is not None
                 else f"  no checkpoint pair for drift; {spikes} loss spike(s)")
    lines += _finetune_lines(db, pid, totals["suspect_run_id"])
    lines.append(f"  tables: {db} (pair_id = '{pid}')")
    return lines


def _finetune_lines(db: str | Path, pid: str, suspect_run_id: str) -> list[str]:
    """Per task, for fine-tunes: the final accuracies, collapses, and suspect vs twin disagreement (RQ3)."""
    collapsed = {r["task"] for r in queries.run(db, "rq3_finetune_accuracy").records()
                 if r["collapsed"] and r["run_id"] == suspect_run_id}
    lines = []
    for r in sorted(_pair_rows(db, "rq3_finetune_disagreement", pid), key=lambda r: r["task"]):
        task, twin, baseline = r["task"], r["twin_accuracy"], r["baseline_disagreement"]
        twin_text = f", twin {twin:.0%}" if twin is not None else ""
        base_text = f" (twin baseline {baseline:.0%})" if baseline is not None else " (no --twin, no baseline)"
        lines.append(f"  fine-tune {task}: accuracy golden {r['golden_accuracy']:.0%}, "
                     f"suspect {r['suspect_accuracy']:.0%}{' COLLAPSED' if task in collapsed else ''}{twin_text}; "
                     f"answers differ on {r['disagreement']:.0%}{base_text}")
    return lines


def _pair_rows(db: str | Path, query: str, pid: str) -> list[dict[str, Any]]:
    """The rows of a named query (they cover every pair) that belong to pair `pid`."""
    return [r for r in queries.run(db, query).records() if r["pair_id"] == pid]


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    known, beam_args = parser.parse_known_args(argv)
    diff(DiffRequest.from_args(known, beam_args))
    return 0


if __name__ == "__main__":
    sys.exit(run())
