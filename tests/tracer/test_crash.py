"""A run killed mid-write reads back as crashed, with everything before the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tracer.log import LogReader, TornTailWarning, rank_dir
from tracer.log.records import EventRecord
from tracer.summary import summarize_run

pytestmark = pytest.mark.slow  # records a run in a subprocess and kills it

SCRIPT = """
import sys
from workload.reference_config import load_config
from jobs.record import record_run
cfg = load_config(None, ["model.n_layers=2", "data.batch_size=2", "data.seq_len=32", "run.steps=100000"])
record_run(cfg, sys.argv[1], node_label="doomed", progress=False)
"""


def test_sigkill_mid_run_leaves_a_readable_crashed_log(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)])
    try:
        seg = rank_dir(out, 0) / "000000.sdclog"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not seg.exists() or seg.stat().st_size < 20_000):
            time.sleep(0.1)
        assert seg.exists() and seg.stat().st_size >= 20_000, "the run never got going"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    reader = LogReader(rank_dir(out, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        records = list(reader.records())
    assert not reader.status.complete and reader.status.end is None
    steps = [r.step for r in records if isinstance(r, EventRecord) and r.kind == "step"]
    assert steps == list(range(len(steps))) and len(steps) >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        (summary,) = summarize_run(out)
    assert not summary.status.complete
