"""A tensor-parallel job, DTensor ``parallelize_module`` with Colwise/Rowwise plans on 2 gloo ranks under torchrun
(examples/torchrun_tp.py), traced: the hooks fire on the parallelized linears and the GELU between them, two runs
are bit-identical, and a fault in rank 1's GELU at step 3 is found by ``sdc diff`` on rank 1 first and replayed by
``sdc replay --workload examples.torchrun_tp:build``: lockstep mismatches at that site only, and parameter sync's
noise-to-signal is numpy's on the full gradients.

Launches: 3 torchrun jobs (golden, again, suspect), two replays and one of `full_gradients`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sdc.cli import main
from tests.parallel.test_fsdp2 import diffed_mismatches, lockstep_hits, rank1_fault, torchrun
from tests.parallel.test_ranks import query_rows, summary
from tests.parallel.test_user_ranks import param_sync_noise
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.sharding import shards_of

pytestmark = pytest.mark.slow  # torchrun launches ranks as processes

EXAMPLE = "examples.torchrun_tp"
SITES = [f"blocks.{b}.mlp.{i}" for b in (0, 1) for i in (0, 1, 2)]
LINEARS = [f"blocks.{b}.mlp.{i}" for b in (0, 1) for i in (0, 2)]

# The GELU between the linears runs on each rank's share of the hidden units, so its fault stays on rank 1's site
# (a fault in mlp.2's partial sums would reach rank 0 through the all-reduce).
RANK1_FAULT = rank1_fault("gelu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("tp")
    profile = root / "rank1.toml"
    profile.write_text(RANK1_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        profile=profile,
        golden=torchrun(root / "golden", example=EXAMPLE),
        suspect=torchrun(root / "suspect", "--fault-profile", str(profile), example=EXAMPLE),
    )


def test_a_tensor_parallel_run_records_its_shards_and_sites_and_twice_is_bit_identical(
    runs: SimpleNamespace, tmp_path: Path
) -> None:
    golden, again = runs.golden, torchrun(tmp_path / "again", example=EXAMPLE)
    comparison = compare_runs(golden, again)
    assert comparison.first is None and comparison.steps == 5, comparison
    forward: dict[int, dict[tuple[int, str], int]] = {}
    for rank in (0, 1):
        reader = LogReader(rank_dir(golden, rank))
        shards = shards_of(reader.header.extra)
        assert set(shards) == {f"{s}.{p}" for s in LINEARS for p in ("weight", "bias")}  # only the MLPs are DTensors
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
        for site in ("blocks.1.mlp.0", "blocks.1.mlp.1"):  # this rank's half of the 128 hidden units
            assert {r.meta for r in records if r.name == site and r.phase == Phase.FORWARD} == {"float32[4,8,64]"}
        forward[rank] = {(r.step, r.name): r.fingerprint for r in records if r.phase == Phase.FORWARD}
    # Each rank holds half of mlp.0's hidden units; mlp.2's all-reduced output is the same on both.
    for step in range(5):
        for b in (0, 1):
            for half in (f"blocks.{b}.mlp.0", f"blocks.{b}.mlp.1"):
                assert forward[0][step, half] != forward[1][step, half]
            assert forward[0][step, f"blocks.{b}.mlp.2"] == forward[1][step, f"blocks.{b}.mlp.2"]


def test_a_fault_in_rank_1s_gelu_is_rank_1s_first_divergence(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """mlp.2 all-reduces the partial sums: rank 0 sees rank 1's fault there, after."""
    db = runs.root / "tp.duckdb"
    assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--db", str(db)]) == 0
    capsys.readouterr()
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        3,
        0,
        "blocks.1.mlp.1 forward",
    ), row


def test_lockstep_replay_of_the_torchrun_recording_mismatches_at_the_faulty_site_only(runs: SimpleNamespace) -> None:
    hits = lockstep_hits(runs.golden, runs.suspect, f"{EXAMPLE}:build", runs.root / "lockstep")
    # Forward only: the GELU's backward reads its input, which the fault left alone, and golden gradients.
    assert hits == {1: {(3, "blocks.1.mlp.1", "forward")}, 0: set()}, hits
    rows = diffed_mismatches(runs.golden, runs.suspect, runs.root / "lockstep", runs.root / "replay.duckdb")
    assert rows == {(1, 3, "blocks.1.mlp.1", "forward")}, rows


def test_param_sync_noise_is_that_of_the_full_gradients_gathered_from_the_shards(runs: SimpleNamespace) -> None:
    """Shard(0) and Shard(1) weights count once, as do the parameters every rank holds whole."""
    expected, totals = param_sync_noise(
        runs.golden, runs.suspect, runs.profile, f"{EXAMPLE}:build", runs.root / "param-sync"
    )
    assert expected > 0
    assert totals == [pytest.approx([expected], rel=1e-6)] * 2


def test_with_default_sites_a_fault_before_the_all_reduce_is_tied_never_credited_to_rank_0(
    runs: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The default sites are the blocks' attention and MLP: ``blocks.1.mlp``'s output is after its all-reduce, so
    rank 1's GELU fault first shows on both ranks at the same point. Neither went first, and the diff says so."""
    record = ["record", "--workload", f"{EXAMPLE}:build", "--nproc", "2", "--steps", "4", "--quiet"]
    golden, suspect = tmp_path / "golden", tmp_path / "suspect"
    assert main([*record, "--out", str(golden), "--node-label", "golden"]) == 0
    assert main([*record, "--out", str(suspect), "--node-label", "sick", "--fault-profile", str(runs.profile)]) == 0
    assert LogReader(rank_dir(golden, 0)).header.extra["sites"] == [
        f"blocks.{b}.{p}" for b in (0, 1) for p in ("attention", "mlp")
    ]
    db = tmp_path / "tied.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert {(r["step"], r["name"], r["phase"]) for r in firsts.values()} == {(3, "blocks.1.mlp", "forward")}, firsts
    assert not any(r["went_first"] for r in firsts.values()) and all(r["tied"] for r in firsts.values()), firsts
    row = summary(db)
    assert (row["first_rank"], row["first_tied_ranks"], row["first_step"], row["first_site"]) == (
        None,
        [0, 1],
        3,
        "blocks.1.mlp forward",
    ), row
    assert "went first" not in out and "first divergence: rank 0 (tied), step 3" in out, out
    assert "ranks 0, 1 tie" in out, out
