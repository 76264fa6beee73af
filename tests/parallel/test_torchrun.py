"""A user's own torchrun job traced with the same Tracer (examples/torchrun_ddp.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracer.log import LogReader, list_ranks, rank_dir
from tracer.log.records import Phase, TensorRecord

pytestmark = pytest.mark.slow  # torchrun launches ranks as processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_ddp.py"


def test_torchrun_job_writes_one_log_per_rank_and_replicas_agree(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
         "--out", str(out), "--steps", "3"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert list_ranks(out) == [0, 1]
    state: dict[int, dict[tuple[int, str, Phase], int]] = {}
    inputs: dict[int, set[int]] = {}
    for rank in (0, 1):
        reader = LogReader(rank_dir(out, rank))
        h = reader.header
        assert (h.rank, h.world_size) == (rank, 2)
        assert h.extra["parallel"] == {"dp": 2, "tp": 1, "sp": False, "coords": {"dp": rank, "tp": 0}}
        records = [r for r in reader.records() if isinstance(r, TensorRecord)]
        assert {r.step for r in records} == {0, 1, 2}
        state[rank] = {(r.step, r.name, r.phase): r.fingerprint for r in records if r.phase in (Phase.GRAD, Phase.PARAM)}
        inputs[rank] = {r.fingerprint for r in records if r.phase == Phase.INPUT}
    # Each replica saw its own data, yet DDP's all-reduce leaves them identical gradients and parameters.
    assert inputs[0].isdisjoint(inputs[1])
    assert state[0] == state[1] and len(state[0]) > 0
