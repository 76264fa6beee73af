"""The launcher: a hung rank ends the job with one error instead of hanging it."""

from __future__ import annotations

import pytest

from tracer.errors import CaptureError
from tracer.launch import launch

pytestmark = pytest.mark.slow  # launches ranks and waits out a collective timeout


def test_a_hung_rank_fails_the_job_after_the_collective_timeout() -> None:
    with pytest.raises(CaptureError, match=r"^rank 0 failed: RuntimeError: .*[Tt]imed out") as err:
        launch("tests.parallel.ranks:hang_on_rank_1", {}, 2, timeout_s=3)
    assert "\n" not in str(err.value)
