"""The warm zygote a job's process is forked from (jobs/zygote.py): one per launching process and import-time
environment, so torch is imported once however many jobs a process launches, and a job still sees the environment,
folder and descriptors its launch gave it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobs import zygote
from jobs.launch import launch

pytestmark = [
    pytest.mark.slow,  # launches ranks
    pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process parents from /proc"),
]

TARGET = "tests.parallel.ranks:lineage"


def test_jobs_of_one_process_fork_from_one_zygote_and_a_changed_environment_gets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SDC_TEST_ZYGOTE", "first")
    first, again = (launch(TARGET, {"variable": "SDC_TEST_ZYGOTE"}, 2) for _ in range(2))
    for result in (first, again):
        assert result[0] == result[1] and result[0]["value"] == "first"
        assert result[0]["zygote"] not in (os.getpid(), result[0]["job"])
    assert first[0]["job"] != again[0]["job"] and first[0]["zygote"] == again[0]["zygote"]  # one zygote, two jobs
    # A variable read when torch loads may have changed: a new zygote is started with it, and the old one ends.
    monkeypatch.setenv("SDC_TEST_ZYGOTE", "second")
    other = launch(TARGET, {"variable": "SDC_TEST_ZYGOTE"}, 1)[0]
    assert other["value"] == "second" and other["zygote"] != first[0]["zygote"]
    assert not Path(f"/proc/{first[0]['zygote']}").exists()
    # The per-job variables are each launch's own, not the zygote's.
    ports = [launch(TARGET, {"variable": "MASTER_PORT"}, 1)[0] for _ in range(2)]
    assert {p["zygote"] for p in ports} == {other["zygote"]} and ports[0]["value"] != ports[1]["value"]


def test_a_zygote_that_died_is_started_again() -> None:
    before = launch(TARGET, {"variable": "PATH"}, 1)[0]["zygote"]
    os.kill(before, signal.SIGKILL)
    (dead,) = [z for z in zygote._ZYGOTES.values() if z.process.pid == before]
    dead.process.wait()
    assert launch(TARGET, {"variable": "PATH"}, 1)[0]["zygote"] != before
