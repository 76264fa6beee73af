"""Fixtures shared by every test package: small, real configs and runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Before anything loads torch (libgomp reads it once), and inherited by every rank and CLI process a test starts:
# OpenMP's idle threads sleep instead of spinning. Spinning threads take the cores from the other processes of a
# multi-rank test (2 ranks x 2 intra-op threads on 2 cores) and from whatever else runs beside the suite: 4 small
# records in one process took 9.5-12.6 CPU s spinning against 0.9 s sleeping on a loaded 2-core machine, a dp=2
# record's ranks 26 against 12 CPU s. Only idle threads change: the bits a run records do not.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# pytest caches each test module with its asserts rewritten (tests/**/__pycache__), but not while bytecode writing is
# off, as PYTHONDONTWRITEBYTECODE turns it off (this machine's image sets it): then every worker of every run parsed
# and rewrote all 240 test modules again, about 5 s a worker. On here, in the test processes only (their children
# keep the environment's setting), so every run after the first reads the cache.
sys.dont_write_bytecode = False

pytest_plugins = ["tests.budget"]

from tests.support import SCALE_AT_1, TINY_FINETUNE, made_once, small_config  # noqa: E402 - imports torch
from workload.reference_config import Config  # noqa: E402


@pytest.fixture
def small_cfg() -> Config:
    """A 2-layer workload with a handful of short steps: real, but quick."""
    return small_config()


@pytest.fixture
def run_factory(tmp_path: Path):
    """Record small real runs by name: ``run_factory("golden", "train.seed=1")``."""
    from jobs.record import record_run

    def make(name: str, *overrides: str, **kwargs) -> Path:
        out = tmp_path / name
        record_run(small_config(*overrides), out, node_label=name, progress=False, **kwargs)
        return out

    return make


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small pretraining run, finished, with its final checkpoint."""
    from jobs.record import record_run

    def make(root: Path) -> None:
        record_run(small_config(), root / "golden", node_label="golden", progress=False)

    return made_once(tmp_path_factory, "pretrained", make) / "golden"


@pytest.fixture(scope="session")
def tuned(pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """TINY_FINETUNE fine-tunes of `pretrained`: ``golden``, the same on ``node``, the golden's shuffle-seed
    ``twin``, and ``sick``, a node whose SCALE_AT_1 faults hit step 1."""
    import dataclasses

    from faults import load_profile
    from jobs.finetune import finetune_run

    runs: dict[str, dict] = {
        "golden": {},
        "node": {},
        "twin": {"settings": dataclasses.replace(TINY_FINETUNE, shuffle_seed=1)},
        "sick": {"fault_seed": 2},  # and the SCALE_AT_1 profile, written beside the runs
    }

    def make(root: Path) -> None:
        (root / "scale.toml").write_text(SCALE_AT_1, encoding="utf-8")
        runs["sick"]["fault_profile"] = load_profile(root / "scale.toml")
        for name, kwargs in runs.items():
            settings = {"settings": TINY_FINETUNE, **kwargs}
            finetune_run(pretrained, root / name, node_label=name, progress=False, **settings)

    root = made_once(tmp_path_factory, "tuned", make)
    return {name: root / name for name in runs}


@pytest.fixture(scope="session")
def fsdp2_golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/torchrun_fsdp2.py under torchrun on 2 ranks, 5 steps, no fault: the golden of the FSDP2 tests in
    tests/parallel/test_fsdp2.py and tests/faults/test_state_faults.py, recorded once. Read only: copy it to change
    it."""
    from tests.parallel.test_fsdp2 import torchrun

    return made_once(tmp_path_factory, "fsdp2", lambda root: torchrun(root / "golden")) / "golden"


# The longest test files, measured on a quiet 2-core fresh clone (`make test`, tests/budget.py's list), go to the
# workers first, then every other file with a slow test, then the quick ones: with `--dist loadfile
# --no-loadscope-reorder` (Makefile) xdist hands out files in collection order, and a long one started last leaves
# the other worker idle for its whole length (torchtitan on 4 ranks, the fleet-mini study: minutes each). Without
# --no-loadscope-reorder xdist orders files by their number of tests, and the fleet-mini study started late.
LONGEST_FIRST = (
    "tests/sdc/test_fleet_study.py",
    "tests/parallel/test_torchtitan.py",
    "tests/integrations/test_sharded_strategies.py",
    "tests/parallel/test_fsdp2.py",
    "tests/replay/test_incident_nondeterministic.py",
    "tests/test_readme.py",
    "tests/parallel/test_tp.py",
    "tests/parallel/test_torchtitan_pipeline.py",
    "tests/benchmarks/test_whole_run.py",
    "tests/parallel/test_torchtitan_moe.py",
    "tests/parallel/test_pipeline.py",
    "tests/parallel/test_ranks.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    has_slow = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item: pytest.Item) -> tuple[int, bool]:
        return rank.get(item.path.relative_to(root).as_posix(), len(rank)), item.path not in has_slow

    items.sort(key=key)  # stable: a file's tests keep their order
