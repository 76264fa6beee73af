"""`sdc report`: the plots it writes, the page that shows them, and what it says without data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import duckdb
import pytest

from analysis import queries
from analysis.pair_summary import summarize_pair
from analysis.study_db import schema_sql
from analysis.study_report import build_report
from sdc.cli import main
from tests.analysis.conftest import Study


def images(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page)


@pytest.mark.slow
def test_report_writes_every_plot_and_the_page_shows_each(
    study: Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert main(["report", "--db", str(study.db), "--out", str(out), "--quiet"]) == 0
    assert "with 5 plot(s)" in capsys.readouterr().out
    page = (out / "index.html").read_text(encoding="utf-8")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(images(page)) == pngs
    pairs = [pid for (pid,) in queries.run(study.db, "SELECT pair_id FROM pairs").rows]
    assert pngs == sorted(
        ["rq1_frequency.png", "rq1_severity.png", "rq2_noise.png", *(f"rq3_{p}_rank0.png" for p in pairs)]
    )
    assert all((out / p).read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert "The fine-tuning tables hold no rows yet." in page  # this study fine-tuned nothing
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched from elsewhere
    for name in ("summary", "rq1_mismatch_by_node", "rq1_abft_by_fault_kind", "rq2_noise_worst", "rq3_loss_spikes"):
        assert f"sdc query {name}" in page


@pytest.mark.slow
def test_tables_are_the_named_queries(study: Study, tmp_path: Path) -> None:
    report = build_report(study.db, tmp_path, progress=False)
    shown = {name: result for s in report.sections for name, result, _ in s.tables}
    assert {
        "summary",
        "rq1_mismatch_bursts",
        "rq2_noise_by_step",
        "rq3_drift_and_loss",
        "guard_detector_scores",
    } <= set(shown)
    for name, result in shown.items():
        assert result == queries.run(study.db, name), name


@pytest.mark.slow
def test_a_report_and_a_pair_summary_open_the_database_once(
    study: Study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each open is a DuckDB instance and a catalog check (about 30 ms); a report runs some 60 queries
    opened: list[Path] = []
    real = queries.open_read_only
    monkeypatch.setattr(queries, "open_read_only", lambda db: opened.append(Path(db)) or real(db))
    report = build_report(study.db, tmp_path, progress=False)
    assert sum(len(s.tables) for s in report.sections) > 10 and opened == [study.db]
    (pair,) = [pid for (pid,) in queries.run(study.db, "SELECT pair_id FROM pairs LIMIT 1").rows]
    opened.clear()
    assert summarize_pair(study.db, pair)[0].startswith("result: ") and opened == [study.db]


@pytest.mark.slow
def test_text_from_the_database_is_escaped(study: Study, tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    shutil.copy(study.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET node_label = '<img src=x onerror=alert(1)>&' WHERE node_label = 'node-7'")
    page = build_report(db, tmp_path / "report", progress=False).index.read_text(encoding="utf-8")
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;&amp;" in page


def test_an_empty_database_says_what_is_missing(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(schema_sql())
    report = build_report(db, tmp_path / "report", progress=False)
    page = report.index.read_text(encoding="utf-8")
    assert report.images == [] and images(page) == []
    assert all(s.notes for s in report.sections)
    assert "The database holds no pairs" in page and "No lockstep replay is loaded" in page
    assert "No parameter-sync replay is loaded" in page
    assert "No pretraining pair is loaded" in page and "No guarded recording beside an unguarded one" in page


@pytest.mark.slow
def test_refuses_an_out_that_is_a_file(study: Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["report", "--db", str(study.db), "--out", str(tmp_path / "file"), "--quiet"]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "r"), "--quiet"]) == 1
    assert "no such study database" in capsys.readouterr().err and not (tmp_path / "r").exists()
