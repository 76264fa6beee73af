"""tests/budget.py: `--budget-s` names a test over the budget and fails the run; within it, the run passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_sleeps.py").write_text(
        "import time\n\ndef test_quick():\n    pass\n\ndef test_sleeps():\n    time.sleep(0.5)\n", encoding="utf-8"
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.budget", "-p", "no:cacheprovider", *args, str(folder)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("budget", "over"), [(0.25, True), (30.0, False)])
def test_a_test_over_the_budget_fails_the_run_and_is_named(tmp_path: Path, budget: float, over: bool) -> None:
    done = _pytest(tmp_path, "--rootdir", str(tmp_path), "--budget-s", str(budget))
    assert "slowest tests" in done.stdout and "test_sleeps" in done.stdout, done.stdout
    assert (done.returncode == 1) is over, done.stdout
    verdict = [line for line in done.stdout.splitlines() if "over the budget" in line]
    assert verdict == (["1 over the budget of 0.25 s: test_sleeps.py::test_sleeps (0.5 s)"] if over else []), verdict
