"""Fixtures shared by every test package: small, real configs and runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import small_config
from tracer.workload.config import Config


@pytest.fixture
def small_cfg() -> Config:
    """A 2-layer workload with a handful of short steps: real, but quick."""
    return small_config()


@pytest.fixture
def run_factory(tmp_path: Path):
    """Record small real runs by name: ``run_factory("golden", "train.seed=1")``."""
    from tracer.workload.train import record_run

    def make(name: str, *overrides: str, **kwargs) -> Path:
        out = tmp_path / name
        record_run(small_config(*overrides), out, node_label=name, progress=False, **kwargs)
        return out

    return make
