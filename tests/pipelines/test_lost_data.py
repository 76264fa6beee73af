"""Corruption on disk is never silent data corruption, and a crashed run says so (issue 13); real runs, one
failure mode per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from analysis import queries
from tests.pipelines.conftest import flipped_copy
from tracer.log import LogReader, rank_dir

pytestmark = pytest.mark.slow  # records real runs or starts processes: seconds each


def query(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_a_flipped_byte_is_lost_steps_not_a_divergence(runs, run_diff, tmp_path: Path) -> None:
    suspect = tmp_path / "flipped"
    flipped_copy(runs["twin"], suspect)  # golden's config for 4 steps: no genuine divergence
    reader = LogReader(rank_dir(suspect, 0), on_corruption="skip")
    list(reader.records())
    (lost,) = reader.status.lost

    _, lines = run_diff(runs["golden"], suspect, skip_corrupt=True)
    db = tmp_path / "study.duckdb"
    assert query(db, "SELECT count(*) FROM first_divergence") == [(0,)]
    assert query(db, "SELECT count(*) FROM event_diffs WHERE status IN ('golden_only', 'suspect_only')") == [(0,)]
    assert query(db, "SELECT side, first_step, last_step, records FROM lost_ranges") == [
        ("suspect", lost.first_step, lost.last_step, lost.records)
    ]
    assert query(db, "SELECT suspect_status, lost_steps > 0 FROM pair_ranks") == [("corrupt", True)]
    (summary,) = queries.run(db, "summary").records()
    assert summary["first_step"] is None and summary["lost_steps"] > 0 and summary["suspect_status"] == "corrupt"
    assert not any("first divergence" in line for line in lines)
    assert any("lost to corruption" in line for line in lines)


def test_a_crashed_suspect_says_where_it_stopped(runs, run_diff, tmp_path: Path) -> None:
    suspect = tmp_path / "crashed"
    shutil.copytree(runs["twin"], suspect)
    seg = rank_dir(suspect, 0) / "000000.sdclog"
    seg.write_bytes(seg.read_bytes()[:-30])

    _, lines = run_diff(runs["golden"], suspect)
    db = tmp_path / "study.duckdb"
    ((last,),) = query(db, "SELECT last_step FROM runs WHERE node_label = 'twin'")
    assert query(db, "SELECT golden_status, suspect_status FROM pair_ranks") == [("complete", "crashed")]
    assert sum(f"suspect run {suspect} rank 0 crashed at step {last}" in line for line in lines) == 1


def test_a_crashed_replay_is_warned_about_and_recorded(runs, run_diff, tmp_path: Path) -> None:
    replay = tmp_path / "replay"
    shutil.copytree(runs["replay"], replay)
    seg = rank_dir(replay, 0) / "000000.sdclog"
    seg.write_bytes(seg.read_bytes()[:-30])

    _, lines = run_diff(runs["golden"], runs["twin"], replays=(str(replay),))
    db = tmp_path / "study.duckdb"
    assert query(db, "SELECT status FROM runs WHERE run_id = 'replay-0001'") == [("crashed",)]
    assert sum("warning: replay0 run" in line and "crashed" in line for line in lines) == 1
