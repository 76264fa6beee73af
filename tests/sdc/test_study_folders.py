"""The study, fleet-study and report folders are claimed as run folders are: `--overwrite` never deletes a file
sdctrace did not write, and a broken state file or an over-long name is one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analysis.study_db import open_writable, schema_sql
from sdc.cli import main
from tests.sdc.test_study import study_file


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and err.count("\n") == 1, err
    return err


def old_study(out: Path) -> list[Path]:
    """A study folder as a finished study leaves it (no real data needed: nothing may be read or deleted)."""
    files = [
        out / "study-state.json",
        out / "study.log",
        out / "runs" / "golden" / "rank-00000" / "000000.sdclog",
        out / "replays" / "flip-lockstep" / "rank-00000" / "000000.sdclog",
        out / "report" / "index.html",
        out / "report" / "rq1_frequency.png",
    ]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text('{"study": "0", "finished": []}' if f.name == "study-state.json" else "x")
    return files


@pytest.mark.parametrize(
    "foreign",
    [
        "runs/thesis.tex",
        "report/my-notes.txt",
        "my-notes.txt",
        "replays/flip-lockstep/notes.md",
        "finetune/flip/rank-00000/draft.txt",
    ],
)
def test_overwrite_keeps_the_users_files_in_a_study_folder(tmp_path: Path, capsys, foreign: str) -> None:
    path, out = study_file(tmp_path), tmp_path / "out"
    files = [*old_study(out), out / foreign]
    (out / foreign).parent.mkdir(parents=True, exist_ok=True)
    (out / foreign).write_text("mine")
    err = one_line_error(capsys, ["study", str(path), "--out", str(out), "--quiet", "--overwrite"])
    assert f"holds {foreign}, which sdctrace did not write; nothing was deleted" in err
    assert all(f.is_file() for f in files) and (out / foreign).read_text() == "mine"


def test_overwrite_keeps_a_study_duckdb_sdctrace_did_not_write(tmp_path: Path, capsys) -> None:
    path, out = study_file(tmp_path), tmp_path / "out"
    files = old_study(out)
    con = duckdb.connect(str(out / "study.duckdb"))
    con.execute("CREATE TABLE thesis AS SELECT 42 AS answer")
    con.close()
    before = (out / "study.duckdb").read_bytes()
    err = one_line_error(capsys, ["study", str(path), "--out", str(out), "--quiet", "--overwrite"])
    assert "study.duckdb: is not a study database sdctrace wrote; nothing was deleted" in err
    assert (out / "study.duckdb").read_bytes() == before and all(f.is_file() for f in files)


def test_a_fleet_study_folder_is_claimed_the_same_way(tmp_path: Path, capsys) -> None:
    out = tmp_path / "fleet"
    (out / "rq1" / "runs").mkdir(parents=True)
    (out / "study-state.json").write_text('{"study": "0", "finished": []}')
    (out / "rq1" / "runs" / "thesis.tex").write_text("mine")
    err = one_line_error(capsys, ["study", "fleet", "--out", str(out), "--quiet", "--overwrite"])
    assert "holds rq1/runs/thesis.tex, which sdctrace did not write" in err
    assert (out / "rq1" / "runs" / "thesis.tex").read_text() == "mine"


def test_report_folder_refuses_foreign_files_and_needs_overwrite(tmp_path: Path, capsys) -> None:
    out, db = tmp_path / "report", tmp_path / "study.duckdb"
    with open_writable(db) as con:  # an empty study database sdctrace wrote
        con.execute(schema_sql())
    out.mkdir()
    (out / "index.html").write_text("old report")
    (out / "my-notes.txt").write_text("mine")
    err = one_line_error(capsys, ["report", "--db", str(db), "--out", str(out), "--overwrite", "--quiet"])
    assert "holds my-notes.txt, which sdctrace did not write; nothing was deleted" in err
    assert (out / "my-notes.txt").read_text() == "mine" and (out / "index.html").read_text() == "old report"
    (out / "my-notes.txt").unlink()
    err = one_line_error(capsys, ["report", "--db", str(db), "--out", str(out), "--quiet"])
    assert "already holds a report; pass --overwrite" in err and (out / "index.html").read_text() == "old report"
    # A database that is missing is refused before --overwrite deletes the old report.
    err = one_line_error(capsys, ["report", "--db", str(tmp_path / "none.duckdb"), "--out", str(out), "--overwrite"])
    assert "no such study database" in err and (out / "index.html").read_text() == "old report"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"not json {", "not valid JSON"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b"\xff\xfe\x00garbage", "not UTF-8 text (byte 0)"),
        (b'{"study": "x", "study": "y"}', "the key 'study' appears twice"),
        (b'{"finished": []}', "field 'study' is missing"),
        (b'{"study": "x", "finished": {"a": 1}}', "field 'finished' is not a list"),
    ],
)
def test_resume_with_a_broken_state_file_is_one_line(tmp_path: Path, capsys, content: bytes, says: str) -> None:
    path, out = study_file(tmp_path), tmp_path / "out"
    old_study(out)
    (out / "study-state.json").write_bytes(content)
    err = one_line_error(capsys, ["study", str(path), "--out", str(out), "--quiet", "--resume"])
    assert f"{out / 'study-state.json'}: " in err and says in err and "--overwrite" in err


def test_a_label_too_long_for_a_file_name_is_refused_at_load(tmp_path: Path, capsys) -> None:
    path = study_file(tmp_path)
    path.write_text(path.read_text().replace('label = "twin"', f'label = "{"n" * 5000}"'))
    err = one_line_error(capsys, ["study", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert (
        "node[0].label" in err and "(5000 characters)' must be letters, digits, '.', '_' or '-' (64 at most)" in err
    ), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command", [["study", "{study}"], ["report", "--db", "{tmp}/study.duckdb"], ["record", "--steps", "1"]]
)
def test_an_out_too_long_for_a_file_name_is_one_line(tmp_path: Path, capsys, command: list[str]) -> None:
    path = study_file(tmp_path)
    argv = [a.replace("{study}", str(path)).replace("{tmp}", str(tmp_path)) for a in command]
    with open_writable(tmp_path / "study.duckdb") as con:
        con.execute(schema_sql())
    err = one_line_error(capsys, [*argv, "--out", str(tmp_path / ("o" * 300)), "--quiet"])
    assert "a name of 300 bytes in it (at most 255); choose a shorter --out" in err
