"""What the environment gets wrong ends in one `sdc: error:` line and a non-zero exit: a --db that is a directory,
a text file or a database another process is writing, a step count or model size beyond the documented bounds,
a Beam runner that does not exist, a file-size limit under `sdc replay` and `sdc incident` (a full disk: one line,
not `OSError: File too large`). One failure mode, one test; main() re-raises anything but an SdcError or a full disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdc.cli import main
from tests.support import SMALL

SMALL_ARGS = [a for kv in SMALL if not kv.startswith("run.") for a in ("--set", kv)]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def golden(pretrained: Path) -> Path:
    """A small real run (shared, read only)."""
    return pretrained


def diff_args(golden: Path, db: Path) -> list[str]:
    return ["diff", "--golden", str(golden), "--suspect", str(golden), "--db", str(db)]


def test_diff_into_a_directory_named_as_db(golden: Path, tmp_path: Path, capsys) -> None:
    assert f"--db {tmp_path}: is a directory" in one_line_error(capsys, diff_args(golden, tmp_path))


def test_diff_into_a_text_file_named_as_db(golden: Path, tmp_path: Path, capsys) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("not a database\n")
    assert f"--db {db}: cannot open as a DuckDB study database" in one_line_error(capsys, diff_args(golden, db))


@pytest.mark.parametrize("command", [["query", "summary"], ["report", "--out", "{tmp}/report"]])
def test_query_and_report_on_a_directory_named_as_db(tmp_path: Path, capsys, command: list[str]) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command] + ["--db", str(tmp_path)]
    assert f"--db {tmp_path}: is a directory" in one_line_error(capsys, argv)


@pytest.fixture
def locked_db(tmp_path: Path):
    """A study database another process holds open for writing, until the test ends."""
    db = tmp_path / "study.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); c.execute('CREATE TABLE t (x INT)');"
            " print('ready', flush=True); sys.stdin.read()",
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        yield db
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_query_on_a_database_another_process_writes(locked_db: Path, capsys) -> None:
    err = one_line_error(capsys, ["query", "--sql", "SELECT 1", "--db", str(locked_db)])
    assert f"--db {locked_db}: locked by another process" in err and "or use another --db" in err


def test_diff_into_a_database_another_process_writes(golden: Path, locked_db: Path, capsys) -> None:
    err = one_line_error(capsys, diff_args(golden, locked_db))
    assert f"--db {locked_db}: locked by another process" in err


def test_record_steps_beyond_the_bound(tmp_path: Path, capsys) -> None:
    err = one_line_error(
        capsys, ["record", "--out", str(tmp_path / "r"), "--steps", str(10**23), "--quiet", *SMALL_ARGS]
    )
    assert "run.steps = 100000000000000000000000 must be in 1..1099511627776" in err


def test_model_size_beyond_the_bound_is_refused_before_allocating(tmp_path: Path, capsys) -> None:
    err = one_line_error(
        capsys, ["record", "--out", str(tmp_path / "r"), "--steps", "1", "--quiet", "--set", "model.dim=1048576"]
    )
    assert "parameters" in err and "over the 10,000,000,000 this reference workload builds" in err


def test_unknown_beam_runner(golden: Path, tmp_path: Path, capsys) -> None:
    err = one_line_error(capsys, [*diff_args(golden, tmp_path / "s.duckdb"), "--", "--runner", "NoSuchRunner"])
    assert "Beam option --runner NoSuchRunner: Unexpected pipeline runner" in err


@pytest.fixture
def file_size_limit():
    """Files may grow to 1 KiB (RLIMIT_FSIZE, SIGXFSZ ignored: a write past it fails with EFBIG, as on a full disk)
    until the test ends."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "--steps", "0:2", "--out", "{tmp}/replay", "--quiet"],
        ["incident", "--at", "1:0:layers.0.attention:forward", "--out", "{tmp}/bundle"],
    ],
)
def test_replay_and_incident_at_the_file_size_limit(
    golden: Path, tmp_path: Path, capsys, command: list[str], file_size_limit: None
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    argv[1:1] = ["--golden", str(golden), "--suspect", str(golden)]
    assert "cannot write (File too large); free space" in one_line_error(capsys, argv)
