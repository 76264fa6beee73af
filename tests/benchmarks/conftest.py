"""benchmarks/ is not a package: its timing helpers are loaded from their file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_TIMING = Path(__file__).parents[2] / "benchmarks" / "timing.py"


@pytest.fixture(scope="session")
def timing() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_timing", _TIMING)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
