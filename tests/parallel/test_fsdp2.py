"""A sharded job, FSDP2's ``fully_shard`` on 2 gloo ranks under torchrun (examples/torchrun_fsdp2.py), traced:
each rank fingerprints its local shards, the header says which slice, a fault on one rank is found there, and
``sdc replay --workload examples.torchrun_fsdp2:build`` replays the torchrun recording at that site only.

Launches: 5 torchrun jobs (again, suspect, another sharding, two HSDP) and one replay, and the golden the session
shares with tests/faults/test_state_faults.py (`fsdp2_golden`, tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from sdc.cli import main
from tests.parallel.test_ranks import query_rows, rank_events, summary
from tracer.compare import compare_runs
from tracer.log import LogReader, list_ranks, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.pairing import pairing_differences
from tracer.sharding import shards_of

pytestmark = pytest.mark.slow  # torchrun launches ranks as processes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples.torchrun_fsdp2"
STEPS = "5"


def rank1_fault(op: str, sites: str = "blocks[.]1[.]mlp", step: int = 3) -> str:
    """A fault profile: rank 1 only, at ``step``, one element of each ``op`` result in the ``sites`` module
    (block 1's MLP), forward."""
    return f"""
[[fault]]
ops = ["{op}"]
sites = "{sites}"
phases = ["forward"]
steps = [{step}]
ranks = [1]
elements = 1
kind = "scale"
factor = 100.0
"""


RANK1_FAULT = rank1_fault("matmul")


def lockstep_hits(golden: Path, suspect: Path, workload: str, out: Path) -> dict[int, set[tuple[int, str, str]]]:
    """``sdc replay --mode lockstep`` of step 3 on both ranks: each rank's mismatched (step, site, phase)."""
    assert (
        main(
            [
                "replay",
                "--golden",
                str(golden),
                "--suspect",
                str(suspect),
                "--workload",
                workload,
                "--nproc",
                "2",
                "--steps",
                "3:4",
                "--mode",
                "lockstep",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    return {
        rank: {
            (e.step, e.fields["site"], e.fields["phase"])
            for e in rank_events(out, rank, "site_mismatch")
            if e.fields["mismatched"]
        }
        for rank in (0, 1)
    }


def diffed_mismatches(golden: Path, suspect: Path, replay: Path, db: Path) -> set[tuple[int, int, str, str]]:
    """``sdc diff --replay`` of a replay log with its pair: the (rank, step, site, phase) rows of ``site_mismatch``
    that mismatched. The replay log's header pairs with golden's as a recording's would (its shards, its sites)."""
    assert (
        main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--replay", str(replay), "--db", str(db)])
        == 0
    )
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT rank, step, site, phase FROM site_mismatch WHERE mismatched > 0").fetchall()
    return set(rows)


def torchrun(out: Path, *args: str, example: str = EXAMPLE, nproc: int = 2) -> Path:
    """Run the example module as its docstring says: ``torchrun -m`` from the repository root."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            example,
            "--out",
            str(out),
            "--steps",
            STEPS,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "returned a view tensor" not in result.stderr, result.stderr[-3000:]  # FSDP2's warning on the root
    return out


@pytest.fixture(scope="module")
def suspect(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example with rank 1's fault (`RANK1_FAULT`)."""
    root = tmp_path_factory.mktemp("fsdp2-suspect")
    (root / "rank1.toml").write_text(RANK1_FAULT, encoding="utf-8")
    return torchrun(root / "suspect", "--fault-profile", str(root / "rank1.toml"))


def test_each_rank_records_its_shard_and_which_slice_it_is(fsdp2_golden: Path) -> None:
    assert list_ranks(fsdp2_golden) == [0, 1]
    params: dict[int, dict[str, int]] = {}
    for rank in (0, 1):
        reader = LogReader(rank_dir(fsdp2_golden, rank))
        shards = shards_of(reader.header.extra)
        embed = shards["embed.weight"]  # (vocab 64, width 32), rows split over the 2 ranks
        assert (embed.mesh_shape, embed.placements, embed.global_shape) == ((2,), ("Shard(0)",), (64, 32))
        assert (embed.offsets, embed.local_shape) == ((32 * rank, 0), (32, 32))
        assert shards["blocks.1.mlp.0.weight"].slice() == ("[0:64, 0:32]", "[64:128, 0:32]")[rank]
        assert len(shards) == 27  # every parameter: fully_shard made each a DTensor
        records = [r for r in reader.records() if isinstance(r, TensorRecord)]
        # Site hooks fire on the fully_shard-ed blocks' attention and MLP, forward and backward.
        sites = {(r.name, r.phase) for r in records if r.phase in (Phase.FORWARD, Phase.BACKWARD)}
        assert sites == {
            (f"blocks.{b}.{part}", phase)
            for b in (0, 1)
            for part in ("attention", "mlp")
            for phase in (Phase.FORWARD, Phase.BACKWARD)
        }
        params[rank] = {r.name: r.fingerprint for r in records if r.phase == Phase.PARAM and r.step == 4}
        assert set(params[rank]) == set(shards)
    # Every rank fingerprints its own half: no parameter's fingerprint is the same on both ranks.
    assert all(params[0][n] != params[1][n] for n in params[0])


def test_inspect_lists_the_sharded_checkpoints_of_every_rank(fsdp2_golden: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["inspect", str(fsdp2_golden)]) == 0
    out = capsys.readouterr().out
    assert out.count("  checkpoints  [0, 2, 4, 5]") == 2, out  # DCP, every --checkpoint-every 2 and at the end


def test_an_fsdp2_run_recorded_twice_is_bit_identical_on_every_rank(
    fsdp2_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    again = torchrun(tmp_path / "again")
    comparison = compare_runs(fsdp2_golden, again)
    assert comparison.first is None and comparison.steps == 5, comparison
    capsys.readouterr()
    db = tmp_path / "a.duckdb"
    assert main(["diff", "--golden", str(fsdp2_golden), "--suspect", str(again), "--db", str(db)]) == 0
    assert "; 0 differ" in capsys.readouterr().out


def test_a_fault_on_rank_1_in_block_1s_mlp_is_rank_1s_first_divergence(
    fsdp2_golden: Path, suspect: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """FSDP2 reduce-scatters the gradients: rank 0 sees rank 1's fault only in its gradient shards, after."""
    db = tmp_path / "fsdp2.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(fsdp2_golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        3,
        0,
        "blocks.1.mlp forward",
    ), row
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert firsts[1]["went_first"] and not firsts[0]["went_first"]
    assert (firsts[1]["step"], firsts[1]["microbatch"], firsts[1]["name"], firsts[1]["phase"]) == (
        3,
        0,
        "blocks.1.mlp",
        "forward",
    ), firsts[1]
    assert firsts[0]["step"] == 3 and firsts[0]["phase"] in ("backward", "grad"), firsts[0]
    assert firsts[1]["slice"] is None  # a site's output, no parameter
    # The gradient shards FSDP2 reduce-scattered: rank 0 names the slice of the parameter its fingerprint covers.
    # Every gradient shard differs there; the first recorded is the embedding's (64, 32): rank 0 holds rows 0..31.
    assert (firsts[0]["phase"], firsts[0]["name"], firsts[0]["slice"]) == ("grad", "embed.weight", "[0:32, 0:32]")
    assert "grad embed.weight (shard [0:32, 0:32] of 64x32)" in out, out
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT placements, global_shape, slice FROM param_shards WHERE rank = 1 AND name = 'embed.weight' "
            "AND run_id = (SELECT suspect_run_id FROM pair_ranks WHERE rank = 1)"
        ).fetchall()
    assert rows == [(["Shard(0)"], [64, 32], "[32:64, 0:32]")]


def test_the_torchrun_recording_replays_in_lockstep_and_mismatches_at_the_faulty_site_only(
    fsdp2_golden: Path, suspect: Path, tmp_path: Path
) -> None:
    """The example's own run, checkpointed sharded every 2 steps, rebuilt by its factory on 2 ranks."""
    hits = lockstep_hits(fsdp2_golden, suspect, f"{EXAMPLE}:build", tmp_path / "lockstep")
    # The site only: its backward reads the activations its own faulty forward saved, so it mismatches too.
    assert hits == {1: {(3, "blocks.1.mlp", "forward"), (3, "blocks.1.mlp", "backward")}, 0: set()}, hits
    rows = diffed_mismatches(fsdp2_golden, suspect, tmp_path / "lockstep", tmp_path / "replay.duckdb")
    assert rows == {(1, 3, "blocks.1.mlp", "forward"), (1, 3, "blocks.1.mlp", "backward")}, rows


def test_another_sharding_of_the_same_model_does_not_pair_and_one_line_says_which_field(
    fsdp2_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    other = torchrun(tmp_path / "dim1", "--shard-dim", "1")
    differences = pairing_differences(LogReader(rank_dir(fsdp2_golden, 1)).header, LogReader(rank_dir(other, 1)).header)
    assert len(differences) == 1, differences
    assert differences[0].startswith(
        "shards.placements: ['Shard(0)'] vs ['Shard(1)'] for 10 parameters (embed.weight, "
    ), differences
    assert "same device mesh and fully_shard/parallelize_module plan" in differences[0]
    capsys.readouterr()
    db = tmp_path / "x.duckdb"
    assert main(["diff", "--golden", str(fsdp2_golden), "--suspect", str(other), "--db", str(db)]) != 0
    assert "shards.placements: ['Shard(0)'] vs ['Shard(1)']" in capsys.readouterr().err


def test_hsdp_on_four_ranks_records_its_2d_mesh_and_twice_is_bit_identical(tmp_path: Path) -> None:
    a = torchrun(tmp_path / "a", "--replicate", "2", nproc=4)
    b = torchrun(tmp_path / "b", "--replicate", "2", nproc=4)
    assert list_ranks(a) == [0, 1, 2, 3]
    for rank in range(4):
        embed = shards_of(LogReader(rank_dir(a, rank)).header.extra)["embed.weight"]
        assert (embed.mesh_shape, embed.mesh_dims) == ((2, 2), ("replicate", "shard"))
        assert embed.placements == ("Replicate()", "Shard(0)")
        assert embed.offsets == (32 * (rank % 2), 0)  # the shard dimension is the mesh's inner one
    result = compare_runs(a, b)
    assert result.first is None and result.events > 0
