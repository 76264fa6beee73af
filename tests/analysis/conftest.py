"""One small, real study database for the query and report tests, built once per package.

- ``golden``: 6 steps of the SMALL workload, checkpoints every 2 steps;
- ``node-7``: the same, with ABFT and the fault profile ``NODE_7`` below: scaled elements in
  ``layers.1.feed_forward`` at steps 1-2 (ABFT sees them), a flipped last mantissa bit in
  ``layers.0.attention`` at step 4 (below ABFT's rounding bound) and a blown-up LM head at
  step 5 (a loss spike);
- ``lockstep``: a lockstep replay of steps 0-5 and ``param-sync``: a parameter-sync replay of
  steps 3-5, both emulating node-7's profile;
- ``node-3``: a healthy twin of 3 steps, diffed without replays.

Both pairs are loaded with `sdc diff` (its default Beam runner) into ``study.duckdb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from faults import load_profile
from jobs.record import record_run
from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile
from sdc.cli import main
from tests.support import small_config

NODE_7 = """
description = "test node: a burst of scaled results (steps 1-2), a last-bit flip (step 4), a blown-up LM head (step 5)"
seed = 3

[[fault]]
ops = ["matmul"]
sites = "layers\\\\.1\\\\.feed_forward"
phases = ["forward"]
steps = [1, 2]
elements = 1
kind = "scale"
factor = 100.0

[[fault]]
ops = ["matmul"]
sites = "layers\\\\.0\\\\.attention"
phases = ["forward"]
steps = [4]
elements = 1
kind = "bitflip"
bits = 0

[[fault]]
ops = ["matmul"]
sites = "output"
phases = ["forward"]
steps = [5]
fraction = 0.01
kind = "scale"
factor = 1000.0
"""


@dataclass(frozen=True)
class Study:
    db: Path
    golden: Path
    node7: Path
    node3: Path
    lockstep: Path
    param_sync: Path


def diff(golden: Path, suspect: Path, db: Path, *replays: Path) -> None:
    extra = [a for r in replays for a in ("--replay", str(r))]
    args = [
        "diff",
        "--golden",
        str(golden),
        "--suspect",
        str(suspect),
        "--db",
        str(db),
        *extra,
        "--",
        "--direct_running_mode=in_memory",
    ]
    assert main(args) == 0


@pytest.fixture(scope="package")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("study")
    profile = root / "node-7.toml"
    profile.write_text(NODE_7, encoding="utf-8")
    cfg = small_config("run.steps=6")
    s = Study(
        root / "study.duckdb", root / "golden", root / "node-7", root / "node-3", root / "lockstep", root / "param-sync"
    )
    record_run(cfg, s.golden, node_label="golden", progress=False)
    record_run(cfg, s.node7, node_label="node-7", progress=False, abft=True, fault_profile=load_profile(profile))
    record_run(small_config("run.steps=3"), s.node3, node_label="node-3", progress=False)
    emulated = suspect_from_profile(str(profile))
    Replayer(ReplayRequest(s.golden, s.lockstep, parse_steps("0:6"), emulated, mode="lockstep", progress=False)).run()
    Replayer(
        ReplayRequest(s.golden, s.param_sync, parse_steps("3:6"), emulated, mode="param-sync", progress=False)
    ).run()
    diff(s.golden, s.node7, s.db, s.lockstep, s.param_sync)
    diff(s.golden, s.node3, s.db)
    return s
