"""Corruption on disk is never silent data corruption, and a crashed run says so (issue 13); real runs, one
failure mode per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
import torch

from analysis import queries
from sdc.cli import main
from tests.pipelines.conftest import flipped_copy
from tests.tracer.test_user_models import MICROBATCHES, hf_lm_loss, train
from tests.tracer.user_models import tiny_hf_gpt2
from tracer.log import LogReader, rank_dir
from tracer.options import RunInfo
from tracer.tracing import Tracer

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


def test_a_suspect_that_failed_in_its_first_step_has_no_steps_to_compare_for_diff_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """transformers' GPT-2 from a config: the suspect's training raises in step 0, after its first microbatch's
    records. Neither `sdc diff` nor `sdc replay --at-first-divergence` may read that as a divergence at step 0 or
    as runs that never diverge."""
    golden = train(tiny_hf_gpt2(), hf_lm_loss, tmp_path / "golden")
    model = tiny_hf_gpt2()
    with pytest.raises(RuntimeError, match="out of memory"):
        run = RunInfo("failed", config={"microbatches": MICROBATCHES})
        with Tracer(model, torch.optim.AdamW(model.parameters()), out=tmp_path / "failed", run=run) as tracer:
            with tracer.step(0):
                inputs, loss = hf_lm_loss(model, torch.Generator().manual_seed(1))
                tracer.microbatch(0, inputs=inputs)
                loss.backward()
                raise RuntimeError("out of memory")
    suspect, db = tmp_path / "failed", tmp_path / "study.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    said = capsys.readouterr().out
    (summary,) = queries.run(db, "summary").records()
    assert (summary["first_step"], summary["compared_through"], summary["suspect_status"]) == (None, None, "failed")
    assert "result: no steps to compare: the suspect completed no step" in said and "first divergence" not in said
    replay = ["replay", "--golden", str(golden), "--suspect", str(suspect), "--at-first-divergence"]
    assert main([*replay, "--out", str(tmp_path / "replay"), "--quiet"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"no steps to compare: the suspect {suspect} completed no step on rank(s) 0"), said
