"""Fixtures for the fault emulator and ABFT tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults import FaultProfile, load_profile
from jobs.record import record_run
from tests.support import made_once, small_config


@pytest.fixture
def write_profile(tmp_path: Path):
    """Write TOML text to a profile file and load it: ``write_profile("[[fault]] ...")``."""

    def write(text: str, name: str = "test-node") -> FaultProfile:
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        return load_profile(path)

    return write


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The healthy twin of every small faulty run: recorded once, read by many tests."""

    def make(root: Path) -> None:
        record_run(small_config(), root / "healthy", node_label="healthy", progress=False)

    return made_once(tmp_path_factory, "faults-healthy", make) / "healthy"
