"""A user's own torchrun job traced with the same Tracer (examples/torchrun_ddp.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdc.cli import main
from tests.parallel.test_ranks import query_rows, summary
from tracer.log import LogReader, list_ranks, rank_dir
from tracer.log.records import Phase, TensorRecord

pytestmark = pytest.mark.slow  # torchrun launches ranks as processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_ddp.py"

# Rank 1 only, step 1, its second microbatch: one element of a matmul result in block 1's MLP, forward.
RANK1_FAULT = """
[[fault]]
ops = ["matmul"]
sites = "1[.]mlp"
phases = ["forward"]
steps = [1]
microbatches = [1]
ranks = [1]
elements = 1
kind = "scale"
factor = 100.0
"""


def torchrun(out: Path, *args: str) -> Path:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(EXAMPLE),
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_torchrun_job_writes_one_log_per_rank_and_replicas_agree(tmp_path: Path) -> None:
    out = torchrun(tmp_path / "ddp", "--steps", "3")
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
        state[rank] = {
            (r.step, r.name, r.phase): r.fingerprint for r in records if r.phase in (Phase.GRAD, Phase.PARAM)
        }
        inputs[rank] = {r.fingerprint for r in records if r.phase == Phase.INPUT}
    # Each replica saw its own data, yet DDP's all-reduce leaves them identical gradients and parameters.
    assert inputs[0].isdisjoint(inputs[1])
    assert state[0] == state[1] and len(state[0]) > 0


def test_a_fault_on_rank_1_of_a_ddp_job_is_the_first_divergence_of_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """torch's DistributedDataParallel, two microbatches: rank 0 sees the fault only through the all-reduce in the
    second microbatch's backward, so its gradients differ; rank 1's forward differed first."""
    (tmp_path / "rank1.toml").write_text(RANK1_FAULT, encoding="utf-8")
    job = ["--steps", "3", "--microbatches", "2"]
    golden = torchrun(tmp_path / "golden", *job)
    suspect = torchrun(tmp_path / "suspect", *job, "--fault-profile", str(tmp_path / "rank1.toml"))
    db = tmp_path / "ddp.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        1,
        1,
        "1.mlp forward",
    ), row
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert firsts[1]["went_first"] and not firsts[0]["went_first"]
    # DDP all-reduced in microbatch 1's backward: rank 0's first difference is a gradient that microbatch changed.
    assert (firsts[0]["step"], firsts[0]["phase"], firsts[0]["microbatch"]) == (1, "grad", 1), firsts[0]
    assert "first divergence: rank 1 (went first), step 1, microbatch 1, forward 1.mlp" in out, out
