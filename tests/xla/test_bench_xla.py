"""benchmarks/bench_xla.py's ratios: from the steps after the warm-up only, paired by step (runs without torch_xla)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def bench_xla(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as `python benchmarks/bench_xla.py` runs: intervals beside it
    spec = importlib.util.spec_from_file_location("bench_xla", BENCHMARKS / "bench_xla.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_compiling_steps_are_one_time_cost_and_the_rest_pair_by_step(bench_xla: ModuleType) -> None:
    # Steps 0-1 compile (100 s); then the traced step costs 3 s where the untraced costs 2, and the machine's
    # drift (step 3 twice as slow for both) cancels pair by pair.
    times = bench_xla.StepTimes({"xla": [40.0, 30.0, 2.0, 4.0, 2.0], "xla traced": [100.0, 90.0, 3.0, 6.0, 3.0]}, 2)
    r = times.ratio("xla traced", "xla")
    assert (r.value, r.low, r.high, r.samples) == (1.5, 1.5, 1.5, 3)
    assert list(times.first_steps("xla traced")) == [100.0, 90.0]
    with pytest.raises(ValueError, match="two or more pairs"):
        bench_xla.StepTimes({"a": [1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0]}, 2).ratio("a", "b")
