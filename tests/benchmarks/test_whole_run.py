"""Whole runs in fresh processes, the cross-check of the in-process ratios: plain and traced alternately, their
paired ratio, the traced runs' one-time cost; and a multi-rank step's time as its slowest rank's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_plain_and_traced_runs_alternate_in_fresh_processes(whole_run) -> None:
    pairs = whole_run.process_pairs("tiny", (), 3, 2)
    assert len(pairs.plain_s) == len(pairs.traced_s) == 2
    assert pairs.ratio.samples == 2 and pairs.ratio.low <= pairs.ratio.value <= pairs.ratio.high
    assert pairs.one_time.start_s > 0 and pairs.one_time.close_s > 0
    assert "whole runs, mean" in pairs.describe(1.05)
    assert whole_run.fresh_kernel_load() >= 0


def test_a_multi_rank_step_takes_as_long_as_its_slowest_rank(timing) -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_bench_parallel", Path(timing.__file__).with_name("bench_parallel.py")
    )
    assert spec is not None and spec.loader is not None
    bench_parallel = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench_parallel
    spec.loader.exec_module(bench_parallel)
    w = timing.WARMUP
    fast = {"untraced": [1.0] * (w + 4), "traced": [5.0] * w + [1.0, 1.0, 1.0, 1.0]}
    slow = {"untraced": [2.0] * (w + 4), "traced": [1.0] * w + [2.2, 2.2, 2.2, 2.2]}
    timed = bench_parallel.slowest_rank([fast, slow])
    assert timed.seconds["traced"] == (2.2,) * 4 and timed.seconds["untraced"] == (2.0,) * 4
    assert timed.warmup["traced"] == (5.0,) * w
    assert timed.ratio("traced", "untraced").value == pytest.approx(1.1)
