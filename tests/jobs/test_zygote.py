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


def test_jobs_fork_from_one_zygote_a_dead_one_is_replaced_and_a_changed_environment_gets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One test, as each zygote it makes costs torch's import (this worker's own is reused where it has one)."""
    first, again = (launch(TARGET, {"variable": "MASTER_PORT"}, 2) for _ in range(2))
    for result in (first, again):
        assert result[0]["job"] == result[1]["job"] and result[0]["zygote"] not in (os.getpid(), result[0]["job"])
    assert first[0]["job"] != again[0]["job"] and first[0]["zygote"] == again[0]["zygote"]  # one zygote, two jobs
    assert first[0]["value"] != again[0]["value"]  # the per-job variables are each launch's own, not the zygote's
    # A zygote that died is started again.
    os.kill(first[0]["zygote"], signal.SIGKILL)
    (dead,) = [z for z in zygote._ZYGOTES.values() if z.process.pid == first[0]["zygote"]]
    dead.process.wait()
    replaced = launch(TARGET, {"variable": "SDC_TEST_ZYGOTE"}, 1)[0]
    assert replaced["zygote"] != first[0]["zygote"] and replaced["value"] is None
    # A variable read when torch loads may have changed: a new zygote is started with it, and the old one ends.
    monkeypatch.setenv("SDC_TEST_ZYGOTE", "changed")
    changed = launch(TARGET, {"variable": "SDC_TEST_ZYGOTE"}, 1)[0]
    assert changed["value"] == "changed" and changed["zygote"] != replaced["zygote"]
    assert not Path(f"/proc/{replaced['zygote']}").exists()
