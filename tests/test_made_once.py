"""tests.support.made_once: a session fixture's folder is made once per run, whichever xdist worker asks first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import made_once

ROOT = Path(__file__).resolve().parents[1]

# Two processes that ask for the same folder at once, as two workers do: the second waits on the lock and reads it.
_ASK = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
from tests.support import made_once

def make(folder):
    time.sleep(0.5)  # long enough for the other process to reach the lock
    with open(Path(sys.argv[1]) / "calls", "a") as f:
        f.write("made\\n")
    (folder / "data").write_text("x")

factory = SimpleNamespace(getbasetemp=lambda: Path(sys.argv[1]) / "popen-gw0")
print((made_once(factory, "shared", make) / "data").read_text())
"""


@pytest.mark.slow  # two processes that import torch (tests.support)
def test_two_workers_asking_at_once_make_the_folder_once(tmp_path: Path) -> None:
    (tmp_path / "popen-gw0").mkdir()
    env = {"PYTEST_XDIST_WORKER": "gw0", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    asks = [
        subprocess.Popen([sys.executable, "-c", _ASK, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    assert [p.communicate(timeout=120)[0] for p in asks] == ["x\n", "x\n"]
    assert (tmp_path / "calls").read_text() == "made\n"
    assert (tmp_path / "made-once" / "shared" / "data").exists()  # beside the workers' folders, shared by them


def test_a_make_that_failed_is_tried_again_from_an_empty_folder(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def fail(folder: Path) -> None:
        (folder / "half").write_text("written before the failure")
        raise RuntimeError("make failed")

    with pytest.raises(RuntimeError, match="make failed"):
        made_once(tmp_path_factory, "retried", fail)
    seen: list[list[str]] = []
    folder = made_once(tmp_path_factory, "retried", lambda f: seen.append(sorted(p.name for p in f.iterdir())))
    assert seen == [[]] and folder == tmp_path_factory.getbasetemp() / "made-once" / "retried"
    made_once(tmp_path_factory, "retried", lambda f: seen.append(["again"]))
    assert seen == [[]]  # made: not made again
