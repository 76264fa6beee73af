"""A pipeline-parallel job (``torch.distributed.pipelining``, 1F1B, one stage per gloo rank) recorded by
``sdc record --nproc 2 --workload examples.torchrun_pipeline:build``: each stage traces its own blocks under
their global names, the header records the schedule, its microbatches and the stage-to-rank map, what a stage
sends is what the next one receives, two runs are bit-identical, and a fault in stage 1's MLP at step 3,
pipeline microbatch 2 is the first divergence, with stage 0, which only received its gradient, later.

A 4-stage GPipe run does the same, each stage that received the corruption ranked after the one it came from, and
a fault in what a stage received (the link) is told apart from one in a stage's compute.

Launches: 4 two-rank record jobs (golden, again, suspect, a corrupted link) and 3 four-rank ones."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sdc.cli import main
from tests.parallel.test_fsdp2 import rank1_fault
from tests.parallel.test_ranks import query_rows, summary
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

pytestmark = pytest.mark.slow  # the record jobs launch ranks as processes

WORKLOAD = "examples.torchrun_pipeline:build"
STEPS, MICROBATCHES = 5, 4
STAGE1_FAULT = rank1_fault("matmul") + "microbatches = [2]\n"  # block 1's MLP, step 3, pipeline microbatch 2


def record(out: Path, *args: str, nproc: int = 2) -> Path:
    command = ["record", "--workload", WORKLOAD, "--nproc", str(nproc), "--steps", str(STEPS), "--quiet"]
    assert main([*command, "--out", str(out), "--node-label", out.name, *args]) == 0
    return out


def first_divergences(golden: Path, suspect: Path, db: Path) -> list[tuple]:
    """``sdc diff`` of the pair: each rank's first divergence, in the diff's order across ranks."""
    assert main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    rows = query_rows(db, "rq1_first_divergence_by_rank")
    return [(r["divergence_order"], r["rank"], r["step"], r["microbatch"], r["name"], r["phase"]) for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("pipeline")
    profile = root / "stage1.toml"
    profile.write_text(STAGE1_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        profile=profile,
        golden=record(root / "golden"),
        suspect=record(root / "suspect", "--fault-profile", str(profile)),
    )


def test_each_stage_traces_its_blocks_under_global_names_and_the_header_says_which_stage(runs: SimpleNamespace) -> None:
    records: dict[int, list[TensorRecord]] = {}
    for rank in (0, 1):
        header = LogReader(rank_dir(runs.golden, rank)).header
        parallel = header.extra["parallel"]
        assert (parallel["pp"], parallel["coords"]["pp"]) == (2, rank)
        assert parallel["pipeline"] == {"schedule": "1F1B", "microbatches": 4, "stage_ranks": {"0": [0], "1": [1]}}
        assert header.extra["sites"] == [f"blocks.{rank}.attention", f"blocks.{rank}.mlp"]
        records[rank] = [r for r in LogReader(rank_dir(runs.golden, rank)).records() if isinstance(r, TensorRecord)]
    grads = {rank: {r.name for r in rs if r.phase == Phase.GRAD} for rank, rs in records.items()}
    assert "embed.weight" in grads[0] and "blocks.0.mlp.0.weight" in grads[0] and "head.weight" not in grads[0]
    assert "head.weight" in grads[1] and "blocks.1.mlp.2.bias" in grads[1] and "embed.weight" not in grads[1]
    # Every site fires once per pipeline microbatch, forward and backward, with the schedule's microbatch index.
    fired = {(r.step, r.microbatch, r.name, r.phase) for r in records[1] if r.name == "blocks.1.mlp"}
    passes = (Phase.FORWARD, Phase.BACKWARD)
    assert fired == {(s, mb, "blocks.1.mlp", p) for s in range(STEPS) for mb in range(MICROBATCHES) for p in passes}

    # What stage 0 sent is what stage 1 received, activations forward and gradients backward.
    def links(rank: int, name: str) -> dict[tuple[int, int, Phase], str]:
        return {(r.step, r.microbatch, r.phase): r.fingerprint for r in records[rank] if r.name == name}

    forward, backward = links(0, "pipeline.0-1.send.in"), links(0, "pipeline.1-0.recv.out")
    assert len(forward) == len(backward) == STEPS * MICROBATCHES
    assert forward == links(1, "pipeline.0-1.recv.out") and backward == links(1, "pipeline.1-0.send.in")
    assert {phase for _, _, phase in forward} == {Phase.FORWARD} and {p for _, _, p in backward} == {Phase.BACKWARD}


def test_a_pipeline_run_recorded_twice_is_bit_identical_on_every_rank(runs: SimpleNamespace, tmp_path: Path) -> None:
    comparison = compare_runs(runs.golden, record(tmp_path / "again"))
    assert comparison.first is None and comparison.steps == STEPS, comparison


def test_a_fault_in_stage_1s_mlp_is_its_first_divergence_and_stage_0_only_received_it(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    db = runs.root / "pipeline.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "first divergence: rank 1 (stage 1) (went first), step 3, microbatch 2, forward blocks.1.mlp\n" in out, out
    assert "first divergence: rank 0 (stage 0) (#2), step 3, microbatch 2, backward pipeline.1-0.recv.out" in out, out
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        3,
        2,
        "blocks.1.mlp forward",
    ), row
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert firsts[1]["went_first"] and firsts[1]["divergence_order"] == 1, firsts
    # Stage 0 first differs where stage 1's corrupted gradient arrived: the same microbatch's backward, later.
    later = firsts[0]
    assert (later["step"], later["microbatch"], later["name"], later["phase"]) == (
        3,
        2,
        "pipeline.1-0.recv.out",
        "backward",
    ), later
    assert later["divergence_order"] == 2 and not later["went_first"], later
    assert (firsts[1]["stage"], later["stage"]) == (1, 0), firsts


def test_replay_of_a_pipeline_run_is_refused_in_one_line(
    runs: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    replay = ["replay", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--workload", WORKLOAD]
    assert main([*replay, "--mode", "lockstep", "--out", str(tmp_path / "replay"), "--quiet"]) != 0
    err = capsys.readouterr().err.strip()
    assert "pipeline-parallel replay is not supported yet" in err and "\n" not in err, err
    assert "1F1B, 2 stages" in err and not (tmp_path / "replay").exists(), err


def test_a_4_stage_gpipe_run_is_bit_identical_and_its_stages_diverge_in_pipeline_order(
    runs: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Stage 1's corrupted activation goes up to stages 2 and 3 in the same microbatch's forward (each first differs
    at what it received, in that order), and its gradient comes down to stage 0 in the backward."""
    gpipe = ("--set", "parallel.schedule=GPipe")
    golden = record(tmp_path / "golden", *gpipe, nproc=4)
    assert LogReader(rank_dir(golden, 3)).header.extra["parallel"]["pipeline"] == {
        "schedule": "GPipe",
        "microbatches": 4,
        "stage_ranks": {str(s): [s] for s in range(4)},
    }
    comparison = compare_runs(golden, record(tmp_path / "again", *gpipe, nproc=4))
    assert comparison.first is None and comparison.steps == STEPS, comparison
    suspect = record(tmp_path / "suspect", *gpipe, "--fault-profile", str(runs.profile), nproc=4)
    order = first_divergences(golden, suspect, tmp_path / "gpipe.duckdb")
    capsys.readouterr()
    assert order == [
        (1, 1, 3, 2, "blocks.1.mlp", "forward"),
        (2, 2, 3, 2, "pipeline.1-2.recv.out", "forward"),
        (3, 3, 3, 2, "pipeline.2-3.recv.out", "forward"),
        (4, 0, 3, 2, "pipeline.1-0.recv.out", "backward"),
    ], order


def test_a_corrupted_receive_is_told_apart_from_a_corrupted_stage(runs: SimpleNamespace, tmp_path: Path) -> None:
    """A fault in what stage 1 received (the link, not a stage's compute): rank 1 first differs at its ``recv``
    while what rank 0 sent is healthy; rank 0 first differs at the gradient that came back."""
    profile = tmp_path / "link.toml"
    profile.write_text(rank1_fault("recv", sites="pipeline[.]0-1") + "microbatches = [2]\n", encoding="utf-8")
    suspect = record(tmp_path / "suspect", "--fault-profile", str(profile))
    order = first_divergences(runs.golden, suspect, tmp_path / "link.duckdb")
    assert order == [
        (1, 1, 3, 2, "pipeline.0-1.recv.out", "forward"),
        (2, 0, 3, 2, "pipeline.1-0.recv.out", "backward"),
    ], order
