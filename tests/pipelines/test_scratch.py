"""A diff leaves no folders behind: Beam's temporary folders go with the job, and what a killed diff left is
removed by the next one (only folders a diff named, only when their process is gone)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipelines.scratch import SCRATCH_PREFIX, scratch_dir
from tests.pipelines.conftest import flipped_copy
from tracer.errors import SdcError


@pytest.mark.slow
def test_a_diff_leaves_no_temporary_folder(runs, run_diff, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "out"
    out.mkdir()
    run_diff(runs["golden"], runs["twin"], db=out / "study.duckdb")
    assert list(temp.iterdir()) == []
    assert [p.name for p in out.iterdir()] == ["study.duckdb"]
    assert tempfile.tempdir == str(temp) and os.environ.get("TMPDIR") != str(temp)


def test_folders_of_killed_diffs_are_removed_and_nothing_else(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = int(gone.stdout)
    left = tmp_path / f"{SCRATCH_PREFIX}staging-{dead}-abc123"
    (left / "pairs").mkdir(parents=True)
    (left / "pairs" / "part.parquet").write_bytes(b"x")
    running = tmp_path / f"{SCRATCH_PREFIX}staging-{os.getpid()}-def456"
    running.mkdir()
    users = [tmp_path / f"{SCRATCH_PREFIX}notes", tmp_path / "sdc-diff-mine"]
    for folder in users:
        folder.mkdir()
    new = Path(scratch_dir(tmp_path, "staging"))
    assert not left.exists() and running.is_dir() and all(f.is_dir() for f in users)
    assert new.is_dir() and new.name.startswith(f"{SCRATCH_PREFIX}staging-{os.getpid()}-")


@pytest.mark.slow
def test_a_failed_diff_leaves_no_new_database(runs, run_diff, tmp_path: Path) -> None:
    suspect = tmp_path / "suspect"
    flipped_copy(runs["twin"], suspect)
    db = tmp_path / "out" / "new.duckdb"
    with pytest.raises(SdcError, match="corrupt"):
        run_diff(runs["golden"], suspect, db=db)
    assert not db.exists() and not db.with_name("new.duckdb.wal").exists()
