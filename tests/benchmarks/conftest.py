"""benchmarks/ is not a package: its timing helpers are loaded from their file, and the modules they import by
name (``from intervals import Ratio``) are found on benchmarks/, as when a benchmark runs as a script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(_BENCHMARKS) not in sys.path:
        sys.path.append(str(_BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", _BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def timing() -> ModuleType:
    return _load("timing")


@pytest.fixture(scope="session")
def intervals() -> ModuleType:
    return _load("intervals")


@pytest.fixture(scope="session")
def whole_run() -> ModuleType:
    return _load("whole_run")
