"""A tensor-parallel job, DTensor ``parallelize_module`` with Colwise/Rowwise plans on 2 gloo ranks under torchrun
(examples/torchrun_tp.py), traced: the hooks fire on the parallelized linears and two runs are bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel.test_fsdp2 import torchrun
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.sharding import shards_of

pytestmark = pytest.mark.slow  # torchrun launches ranks as processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_tp.py"
SITES = [f"blocks.{b}.mlp.{i}" for b in (0, 1) for i in (0, 2)]


def test_a_tensor_parallel_run_records_its_shards_and_sites_and_twice_is_bit_identical(tmp_path: Path) -> None:
    golden, again = torchrun(tmp_path / "golden", example=EXAMPLE), torchrun(tmp_path / "again", example=EXAMPLE)
    comparison = compare_runs(golden, again)
    assert comparison.first is None and comparison.steps == 5, comparison
    forward: dict[int, dict[tuple[int, str], int]] = {}
    for rank in (0, 1):
        reader = LogReader(rank_dir(golden, rank))
        shards = shards_of(reader.header.extra)
        assert set(shards) == {f"{s}.{p}" for s in SITES for p in ("weight", "bias")}  # only the MLPs are DTensors
        colwise, rowwise = shards["blocks.1.mlp.0.weight"], shards["blocks.1.mlp.2.weight"]
        assert (colwise.mesh_dims, colwise.placements, rowwise.placements) == (("tp",), ("Shard(0)",), ("Shard(1)",))
        slices = (("[0:64, 0:32]", "[0:32, 0:64]"), ("[64:128, 0:32]", "[0:32, 64:128]"))
        assert (colwise.slice(), rowwise.slice()) == slices[rank]
        assert shards["blocks.1.mlp.2.bias"].placements == ("Replicate()",)
        records = [r for r in reader.records() if isinstance(r, TensorRecord)]
        # Site hooks fire on the parallelized linears, forward and backward, every step.
        passes = (Phase.FORWARD, Phase.BACKWARD)
        fired = {(r.step, r.name, r.phase) for r in records if r.phase in passes}
        assert fired == {(step, s, phase) for step in range(5) for s in SITES for phase in passes}
        mlp0 = {r.meta for r in records if r.name == "blocks.1.mlp.0" and r.phase == Phase.FORWARD}
        assert mlp0 == {"float32[4,8,64]"}  # this rank's half of the 128 hidden units
        forward[rank] = {(r.step, r.name): r.fingerprint for r in records if r.phase == Phase.FORWARD}
    # Each rank holds half of mlp.0's hidden units; mlp.2's all-reduced output is the same on both.
    for step in range(5):
        for b in (0, 1):
            assert forward[0][step, f"blocks.{b}.mlp.0"] != forward[1][step, f"blocks.{b}.mlp.0"]
            assert forward[0][step, f"blocks.{b}.mlp.2"] == forward[1][step, f"blocks.{b}.mlp.2"]
