"""A rank folder that is a symlink (the user's own: moved to another disk, say) is followed everywhere: `sdc inspect`,
replay's reader and `sdc diff` all read it (issue 31: the diff alone said "holds no log segments"). What is never
trusted is a path read from inside a log, not the folders a user points sdctrace at."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb

from sdc.cli import main
from tracer.log import LogReader, rank_dir


def test_a_symlinked_rank_folder_is_read_by_inspect_and_diff(pretrained: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(pretrained, run)
    moved = tmp_path / "elsewhere" / "rank-00000"
    moved.parent.mkdir()
    rank_dir(run, 0).rename(moved)
    rank_dir(run, 0).symlink_to(moved, target_is_directory=True)
    records = sum(1 for _ in LogReader(rank_dir(run, 0)).records())
    assert main(["inspect", str(run)]) == 0
    db = tmp_path / "s.duckdb"
    assert main(["diff", "--golden", str(run), "--suspect", str(run), "--db", str(db)]) == 0, capsys.readouterr().err
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM event_diffs WHERE NOT equal").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM event_diffs").fetchone()[0] > 0 < records
