"""`DiffRequest` checks its own fields when it is made, from a command line or directly (as ``sdc study`` does)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipelines.arguments import DEFAULT_STEPS_PER_BUCKET, DiffRequest, add_arguments
from tracer.errors import UsageError


def test_a_request_from_the_command_line_keeps_beams_options_apart() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    known, beam_args = parser.parse_known_args(
        ["--golden", "runs/A", "--suspect", "runs/B", "--db", "s.duckdb", "--replay", "runs/R", "--runner=X"]
    )
    request = DiffRequest.from_args(known, beam_args)
    assert request == DiffRequest(
        golden="runs/A",
        suspect="runs/B",
        db=Path("s.duckdb"),
        replays=("runs/R",),
        steps_per_bucket=DEFAULT_STEPS_PER_BUCKET,
        beam_args=("--runner=X",),
    )


@pytest.mark.parametrize("steps", [0, -3])
def test_a_request_with_no_steps_per_bucket_fails_when_made(steps: int) -> None:
    with pytest.raises(UsageError, match=f"--steps-per-bucket must be >= 1, got {steps}"):
        DiffRequest(golden="runs/A", suspect="runs/B", db=Path("s.duckdb"), steps_per_bucket=steps)
