"""benchmarks/bench_startup.py's method: whole processes, the first run of each command apart as one-time cost,
the others alternating; a study database `sdc query` reads. Never a speed."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sdc.cli import main

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench_startup() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # it imports intervals and timing from beside it, as run.py does
    try:
        return importlib.import_module("bench_startup")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_each_command_has_its_first_run_apart_and_runs_more(bench_startup: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "order.txt"
    commands = {name: [sys.executable, "-c", f"open({str(log)!r}, 'a').write({name!r})"] for name in "abc"}
    first, samples = bench_startup.alternate(commands, 3, bench_startup.checkout_env())
    assert set(first) == set("abc") and all(s > 0 for s in first.values())
    assert {name: len(values) for name, values in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert log.read_text() == "abc" + "abc" + "bca" + "cab"  # the first runs, then rounds in rotated order


def test_a_failed_process_is_an_error_not_a_sample(bench_startup: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="exited 3"):
        bench_startup.process_seconds([sys.executable, "-c", "raise SystemExit(3)"], bench_startup.checkout_env())


def test_sdc_query_reads_the_small_study_database(
    bench_startup: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = bench_startup.small_study_db(tmp_path, steps=5)
    assert main(["query", "--sql", bench_startup.QUERY_SQL, "--db", str(db), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["steps,worst", "5,1.0"]


def test_the_timed_sdc_is_this_checkout(bench_startup: ModuleType) -> None:
    argv, shown = bench_startup.sdc_command()
    assert argv[-1].endswith("sdc") or argv[-2:] == ["-m", "sdc.cli"]
    assert bench_startup.checkout_env()["PYTHONPATH"].split(":")[0] == str(BENCHMARKS.parent)
