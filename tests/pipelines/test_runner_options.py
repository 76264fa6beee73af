"""The diff's choices about the Beam job (`pipelines.runner_options`): the default runner and mode, and what
`pipelines.beam_job.run_job` changes while a job runs."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.worker import statesampler

import pipelines.runner_options as options
from pipelines.beam_job import SAMPLING_PERIOD_MS, run_job
from pipelines.scratch import beam_temp
from tracer.errors import UsageError


def test_the_default_runner_and_mode_follow_the_size_of_the_logs() -> None:
    small = options.pipeline_options([], options.IN_MEMORY_BYTES - 1)
    large = options.pipeline_options([], options.IN_MEMORY_BYTES)
    assert options.describe_runner(small) == "FnApiRunner (in_memory)" and options.in_process(small)
    assert options.describe_runner(large).startswith("FnApiRunner (multi_processing, ") and not options.in_process(
        large
    )
    chosen = options.pipeline_options(["--direct_running_mode=multi_processing", "--direct_num_workers=3"], 0)
    assert options.describe_runner(chosen) == "FnApiRunner (multi_processing, 3 workers)"
    assert options.describe_runner(options.pipeline_options(["--runner=DirectRunner"], 0)) == "DirectRunner (in_memory)"
    dask = options.pipeline_options(["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"], 0)
    assert options.describe_runner(dask) == "DaskRunner" and not options.in_process(dask)
    with pytest.raises(UsageError, match="--runner NoSuchRunner"):
        options.pipeline_options(["--runner=NoSuchRunner"], 0)


def test_the_default_runner_hands_its_workers_the_options() -> None:
    with beam_temp():  # a pipeline that is never run leaves its temporary folder behind
        p = options.new_pipeline(options.pipeline_options([], 0))
    assert isinstance(p.runner, FnApiRunner)
    handed = p.runner._provision_info.provision_info.pipeline_options
    assert handed["beam:option:default_sdk_harness_log_level:v1"] == "WARNING"


def _sampling_period(_: int, path: str) -> None:
    Path(path).write_text(str(statesampler.get_current_tracker().sampling_period_ms))


def test_a_job_samples_its_state_promptly_and_leaves_beams_default_behind(tmp_path: Path) -> None:
    """`run_job` shortens the state sampler's longest sleep for the job (`_prompt_state_sampler`): this fails when
    a Beam upgrade builds its sampler differently and the shortening no longer applies."""
    out = tmp_path / "period"
    p = options.new_pipeline(options.pipeline_options([], 0))
    _ = p | beam.Create([0]) | beam.Map(_sampling_period, str(out))
    run_job(p)
    assert int(out.read_text()) == SAMPLING_PERIOD_MS < statesampler.DEFAULT_SAMPLING_PERIOD_MS
    assert statesampler.StateSampler.__init__.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,)
