"""The record job's checks that run before anything is claimed or launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.record import RecordRequest, record
from tests.support import small_config
from tracer.errors import UsageError
from tracer.log import list_ranks


def test_a_resumption_on_another_rank_count_is_refused_before_any_rank_starts(run_factory, tmp_path: Path) -> None:
    run = run_factory("golden", "run.steps=3", "run.checkpoint_every=2")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(UsageError) as caught:
        record(
            small_config("run.steps=3", "run.checkpoint_every=2"),
            RecordRequest(out=run, node_label="golden", resume=True, progress=False),
            nproc=2,
        )
    assert str(caught.value) == (
        f"{run}: was recorded on 1 rank(s), not 2; resume it on as many (--nproc 1, with "
        "the layout options it was recorded with)"
    )
    assert list_ranks(run) == [0] and sorted(p.relative_to(run) for p in run.rglob("*")) == before
