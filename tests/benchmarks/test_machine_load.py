"""`make bench` says, before its ratios, when another job shares the machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_a_busy_core_beside_the_benchmark_is_named_and_warned_of(timing) -> None:
    machine_load = timing.machine_load
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        line = machine_load(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    busy = float(line.split(" cores, ")[1].split(" of them busy")[0])
    assert busy >= 0.6 and "WARNING: another job is running" in line, line
