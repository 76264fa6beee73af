"""`sdc diff` on a full file system ends in one line, with the database as it was (issue 31, case 3).

The file system fills up through RLIMIT_FSIZE in the `sdc diff` process (SIGXFSZ ignored, so a write
past the limit fails with EFBIG as on a full disk): below the largest Parquet file the Beam job writes,
the job fails; above it, DuckDB's load does. A new --db is then never created, an existing one keeps
its bytes and mtime, and no scratch folder is left beside it.
"""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sdc.cli import main
from tests.pipelines.test_foreign_db import snapshot

pytestmark = pytest.mark.slow  # each case is an `sdc diff` process with its Beam job

SDC = [sys.executable, "-m", "sdc.cli"]


@pytest.fixture(scope="module")
def measured(pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The largest Parquet file of the pair's staging, and a study database holding the pair."""
    root = tmp_path_factory.mktemp("full-disk")
    db = root / "study.duckdb"
    assert (
        main(
            [
                "diff",
                "--golden",
                str(pretrained),
                "--suspect",
                str(pretrained),
                "--db",
                str(db),
                "--staging",
                str(root / "staging"),
            ]
        )
        == 0
    )
    return max(p.stat().st_size for p in (root / "staging").rglob("*.parquet")), db


def diff_with_limit(golden: Path, db: Path, limit: int, *extra: str) -> subprocess.CompletedProcess[str]:
    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [*SDC, "diff", "--golden", str(golden), "--suspect", str(golden), "--db", str(db), *extra],
        preexec_fn=limit_writes,
        capture_output=True,
        text=True,
        timeout=600,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("sdc: error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("where", ["beam job", "staging given", "load"])
def test_a_full_disk_creates_no_database(
    pretrained: Path, measured: tuple[int, Path], tmp_path: Path, where: str
) -> None:
    largest, _ = measured
    folder = tmp_path / "study"
    folder.mkdir()
    db = folder / "study.duckdb"
    staging = ["--staging", str(tmp_path / "staging")] if where == "staging given" else []
    limit = largest // 2 if where != "load" else largest + 4096
    line = one_line(diff_with_limit(pretrained, db, limit, *staging))
    stage = f"loading into {db}" if where == "load" else "the Beam job writing Parquet to "
    assert stage in line and "File too large; no database was created" in line, line
    assert list(folder.iterdir()) == []  # no database, no .wal, no scratch folder


@pytest.mark.parametrize("where", ["beam job", "load"])
def test_a_full_disk_leaves_an_existing_database_as_it_was(
    pretrained: Path, measured: tuple[int, Path], tmp_path: Path, where: str
) -> None:
    largest, loaded = measured
    folder = tmp_path / "study"
    folder.mkdir()
    db = folder / "study.duckdb"
    shutil.copy(loaded, db)
    before = snapshot(folder)
    limit = largest // 2 if where != "load" else largest + 4096
    line = one_line(diff_with_limit(pretrained, db, limit))
    stage = f"loading into {db}" if where == "load" else "the Beam job writing Parquet to "
    assert stage in line and f"File too large; {db} is as it was" in line, line
    assert snapshot(folder) == before
