"""Which Beam runner a diff runs on, and how: options from the pass-through arguments, the pipeline, its label.

    opts = pipeline_options(beam_args, input_bytes)   # what `sdc diff` passes after `--`, and the logs' size
    p = new_pipeline(opts)
    describe_runner(opts)                             # "FnApiRunner (in_memory)"

Without ``--runner`` the job runs on Beam's FnApiRunner (`DEFAULT_RUNNER`), in this
process below `IN_MEMORY_BYTES` of logs, else in a worker process per core. Any other
runner's options pass through untouched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import create_runner

from pipelines.beam_internals import CachedViewOptions, remember_signatures
from tracer.errors import UsageError

# Below this much log data the in_memory mode wins: multi_processing pays for worker start-up and moves
# every shuffled batch between processes (2M records on 2 cores: 2.2 s vs 6.2-9.0 s).
IN_MEMORY_BYTES = 1 << 30
# The engine the DirectRunner runs a batch job on. Named directly, because Beam 2.77's DirectRunner first tries
# the Prism runner, downloading its binary from GitHub: offline that fails after a connection attempt and falls
# back here (0.2 s of a 2 s job); online the job would run on a runner nothing here tests.
DEFAULT_RUNNER = "FnApiRunner"
_LOCAL = ("FnApiRunner", "DirectRunner")  # runners that honour --direct_running_mode


def pipeline_options(beam_args: Sequence[str], input_bytes: int) -> PipelineOptions:
    """Beam options from the pass-through arguments. Without --runner: `DEFAULT_RUNNER`, in_memory below
    `IN_MEMORY_BYTES` of log segments, else multi_processing with one worker per CPU."""
    args = list(beam_args)
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    if PipelineOptions(args).view_as(StandardOptions).runner is None:
        mode = (
            PipelineOptions(args).view_as(DirectOptions).direct_running_mode
            if "--direct_running_mode" in given
            else "in_memory"
            if input_bytes < IN_MEMORY_BYTES
            else "multi_processing"
        )
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
    return CachedViewOptions(args)


def new_pipeline(opts: PipelineOptions) -> beam.Pipeline:
    """A pipeline on the runner ``opts`` name. The FnApiRunner also gets the options for its workers, as the
    DirectRunner hands them over: without them a worker process logs at INFO whatever was asked."""
    remember_signatures()
    if _runner_name(opts) != "FnApiRunner":
        return beam.Pipeline(options=opts)
    encoded = JobServiceHandle.encode_pipeline_options(opts.get_all_options())
    provision = beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    return beam.Pipeline(
        runner=fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(provision)), options=opts
    )


def _runner_name(opts: PipelineOptions) -> str:
    return (opts.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]


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
