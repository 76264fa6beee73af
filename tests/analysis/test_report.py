"""`sdc report`: the plots it writes, the page that shows them, and what it says without data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import duckdb
import pytest

from analysis import queries
from analysis.load import schema_sql
from analysis.queries import QueryLibrary
from analysis.report import FINETUNE_QUERIES, build_report
from sdc.cli import main
from tests.analysis.conftest import Study

FINETUNE_SQL = {
    "rq3_finetune_accuracy": "-- fine-tuned accuracy (test)\nSELECT * FROM finetune_eval ORDER BY node_label, task, step",
    "rq3_finetune_disagreement": "-- disagreement (test)\nSELECT * FROM finetune_predictions ORDER BY pair_id, task",
}


def images(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page)


def test_report_writes_every_plot_and_the_page_shows_each(study: Study, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["report", "--db", str(study.db), "--out", str(out), "--quiet"]) == 0
    assert "with 5 plot(s)" in capsys.readouterr().out
    page = (out / "index.html").read_text(encoding="utf-8")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(images(page)) == pngs
    pairs = [pid for (pid,) in queries.run(study.db, "SELECT pair_id FROM pairs").rows]
    assert pngs == sorted(["rq1_frequency.png", "rq1_severity.png", "rq2_noise.png",
                           *(f"rq3_{p}_rank0.png" for p in pairs)])
    assert all((out / p).read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert "No fine-tuning results in this database" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched from elsewhere
    for name in ("summary", "rq1_mismatch_by_node", "rq1_abft_by_fault_kind", "rq2_noise_worst", "rq3_loss_spikes"):
        assert f"sdc query {name}" in page


def test_tables_are_the_named_queries(study: Study, tmp_path: Path) -> None:
    report = build_report(study.db, tmp_path, progress=False)
    shown = {name: result for s in report.sections for name, result, _ in s.tables}
    assert {"summary", "rq1_mismatch_bursts", "rq2_noise_by_step", "rq3_drift_and_loss"} <= set(shown)
    for name, result in shown.items():
        assert result == queries.run(study.db, name), name


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


def test_finetune_section_when_its_tables_hold_rows(study: Study, tmp_path: Path) -> None:
    library = tmp_path / "queries"
    shutil.copytree(Path(queries.__file__).parent, library, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    for name in FINETUNE_QUERIES:
        (library / f"{name}.sql").write_text(FINETUNE_SQL[name], encoding="utf-8")
    db = tmp_path / "study.duckdb"
    shutil.copy(study.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE finetune_eval (node_label VARCHAR, run_id VARCHAR, role VARCHAR, task VARCHAR, "
                    "step BIGINT, accuracy DOUBLE, chance DOUBLE, collapsed BOOLEAN)")
        con.execute("CREATE TABLE finetune_predictions (pair_id VARCHAR, golden_node VARCHAR, suspect_node VARCHAR, "
                    "task VARCHAR, examples BIGINT, disagreement DOUBLE, baseline_disagreement DOUBLE, "
                    "golden_accuracy DOUBLE, suspect_accuracy DOUBLE, twin_accuracy DOUBLE)")
    lib = QueryLibrary(library)
    empty = build_report(db, tmp_path / "empty", library=lib, progress=False)
    assert "The fine-tuning tables hold no rows yet." in empty.index.read_text(encoding="utf-8")

    with duckdb.connect(str(db)) as con:
        con.execute("""INSERT INTO finetune_eval VALUES
            ('golden', 'g', 'golden', 'parity', 10, 0.91, 0.5, false),
            ('node-b', 't', 'twin', 'parity', 10, 0.90, 0.5, false),
            ('node-7', 's', 'suspect', 'parity', 10, 0.50, 0.5, true),
            ('golden', 'g', 'golden', 'copy', 10, 0.80, 0.1, false),
            ('node-7', 's', 'suspect', 'copy', 10, 0.75, 0.1, false)""")
        con.execute("""INSERT INTO finetune_predictions VALUES
            ('p1', 'golden', 'node-7', 'parity', 200, 0.45, 0.03, 0.91, 0.50, 0.90),
            ('p1', 'golden', 'node-7', 'copy', 200, 0.08, 0.05, 0.80, 0.75, NULL)""")
    report = build_report(db, tmp_path / "report", library=lib, progress=False)
    page = report.index.read_text(encoding="utf-8")
    assert "rq3_finetune.png" in images(page) and (tmp_path / "report" / "rq3_finetune.png").is_file()
    assert "sdc query rq3_finetune_disagreement" in page and "No fine-tuning results" not in page


def test_refuses_an_out_that_is_a_file(study: Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["report", "--db", str(study.db), "--out", str(tmp_path / "file"), "--quiet"]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "r"), "--quiet"]) == 1
    assert "no such study database" in capsys.readouterr().err and not (tmp_path / "r").exists()
