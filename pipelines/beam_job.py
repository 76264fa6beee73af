"""The diff's Beam job: the pipeline wired from a plan, run to its end, and the counters it reports.

    p = new_pipeline(opts)                  # pipelines.runner_options
    build_pipeline(p, plan, staging)        # plan: pipelines.plan.DiffPlan
    result, state = run_job(p)
    job_counters(result)                    # {"segments_read": ..., "tensor_records": ...}

The stages (docs/pipelines.md): read every run (`pipelines.log_source`), route the events
(`pipelines.events`), key -> join -> diff the tensors (`pipelines.tensor_diff`), first
divergences and detections (`pipelines.detections`), loss curves and parameter drift
(`pipelines.loss_and_drift`), detector alarms (`pipelines.alarms`), and one Parquet table per
output under the staging directory (`pipelines.sink`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import apache_beam as beam
from apache_beam.runners.runner import PipelineResult
from apache_beam.runners.worker import statesampler

from pipelines import alarms, detections, log_source, loss_and_drift, tensor_diff
from pipelines import events as events_mod
from pipelines.log_source import EVENTS, SEGMENTS, TENSORS
from pipelines.pairing import BOUNDS, LOST, ComparisonBounds
from pipelines.plan import DiffPlan
from pipelines.runner_options import in_process
from pipelines.sink import WriteTables
from pipelines.tables import SCHEMAS, TABLES

SAMPLING_PERIOD_MS = 5


def build_pipeline(p: beam.Pipeline, plan: DiffPlan, staging: str) -> None:
    """Wire the whole job: read every run, diff, derive metrics, write one Parquet table per output (all but
    ``pairs``, the plan's own row, which `diff` writes beside them)."""
    sides = plan.sides()
    spread = not in_process(p.options)
    read = p | "Read runs" >> log_source.ReadRuns(sides, plan.steps_per_bucket, spread)
    ranks = read[SEGMENTS] | "Summarise ranks" >> log_source.SummariseRanks(sides)
    bounds = ranks[log_source.RANKS] | "Compared steps" >> ComparisonBounds(plan.run_ids())
    events = read[EVENTS] | "Route events" >> events_mod.RouteEvents(plan.run_ids())
    faults = events[events_mod.FAULTS]
    diffs = read[TENSORS] | "Diff tensors" >> tensor_diff.DiffTensors(
        bounds[BOUNDS], faults, bounds[LOST], plan.tolerance
    )
    small = (
        read[TABLES],
        ranks[TABLES],
        bounds[TABLES],
        events[TABLES],
        diffs[tensor_diff.FINDINGS] | "Rank findings" >> detections.RankFindings(faults, events[events_mod.CHECKS]),
        events[events_mod.STEPS] | "Loss curves" >> loss_and_drift.LossCurves(),
        *([p | "Parameter drift" >> loss_and_drift.ParamDrift(plan.drift, spread)] if plan.drift else []),
        read[log_source.EVIDENCE] | "Detector alarms" >> alarms.DetectorAlarms(plan.suspect),
    )
    # The diff tables are written where they are made; the others, a few rows per rank or segment, meet first:
    # one writing step for all of them costs less than a step each.
    tables = (diffs[TABLES], small | "Small tables" >> beam.Flatten())
    _ = tables | "Write tables" >> WriteTables(staging, SCHEMAS)


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


def job_counters(result: Any) -> dict[str, int]:
    """The job's own Beam metrics, summed per name; empty for runners that report none."""
    try:
        found = result.metrics().query()["counters"]
    except Exception:  # noqa: BLE001 - runners that do not report metrics
        return {}
    out: dict[str, int] = {}
    for c in found:
        if c.key.metric.namespace == log_source.NAMESPACE:
            value = c.committed if c.committed is not None else c.attempted
            out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    return out
