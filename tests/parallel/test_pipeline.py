"""A pipeline-parallel job (``torch.distributed.pipelining``, 1F1B, one stage per gloo rank) recorded by
``sdc record --nproc 2 --workload examples.torchrun_pipeline:build``: each stage traces its own blocks under
their global names, the header records the schedule, its microbatches and the stage-to-rank map, what a stage
sends is what the next one receives, two runs are bit-identical, and a fault in stage 1's MLP at step 3,
pipeline microbatch 2 is the first divergence, with stage 0, which only received its gradient, later.

A 4-stage GPipe run does the same, each stage that received the corruption ranked after the one it came from, and
a fault in what a stage received (the link) is told apart from one in a stage's compute. ``sdc replay --nproc``
restores each stage from its own checkpoint: lockstep mismatches at the faulty site only (what a stage receives is
made golden too, so a corrupted receive is charged to the link), a healthy twin replays clean, and parameter sync
gives every stage the whole model's noise-to-signal. ``sdc certify`` names the checkpoint before the fault and
the stage the corruption entered on, and ``sdc incident`` captures the site on the stage that holds it.

Launches: 4 two-rank record jobs (golden, again, suspect, a corrupted link), 4 two-rank replays, a two-rank
incident capture, 3 four-rank record jobs and a four-rank replay."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from sdc.cli import main
from tests.parallel.test_fsdp2 import diffed_mismatches, rank1_fault
from tests.parallel.test_ranks import query_rows, rank_events, summary
from tests.replay.incident_support import assert_persistent_under_emulation_only
from tracer.checkpoint import checkpoint_dir
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

pytestmark = pytest.mark.slow  # the record jobs launch ranks as processes

WORKLOAD = "examples.torchrun_pipeline:build"
STEPS, MICROBATCHES = 5, 4
STAGE1_FAULT = rank1_fault("matmul") + "microbatches = [2]\n"  # block 1's MLP, step 3, pipeline microbatch 2
LINK_FAULT = rank1_fault("recv", sites="pipeline[.]0-1") + "microbatches = [2]\n"  # what stage 1 received


def record(out: Path, *args: str, nproc: int = 2) -> Path:
    command = ["record", "--workload", WORKLOAD, "--nproc", str(nproc), "--steps", str(STEPS), "--quiet"]
    assert main([*command, "--out", str(out), "--node-label", out.name, *args]) == 0
    return out


def first_divergences(golden: Path, suspect: Path, db: Path) -> list[tuple]:
    """``sdc diff`` of the pair: each rank's first divergence, in the diff's order across ranks."""
    assert main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    rows = query_rows(db, "rq1_first_divergence_by_rank")
    return [(r["divergence_order"], r["rank"], r["step"], r["microbatch"], r["name"], r["phase"]) for r in rows]


def replayed(golden: Path, suspect: Path, out: Path, mode: str = "lockstep", nproc: int = 2) -> Path:
    """``sdc replay --nproc`` of step 3, each stage restored from its own checkpoint (the one of step 2)."""
    args = ["--golden", str(golden), "--suspect", str(suspect), "--workload", WORKLOAD, "--steps", "3:4"]
    assert main(["replay", *args, "--nproc", str(nproc), "--mode", mode, "--out", str(out), "--quiet"]) == 0
    return out


def mismatched(replay: Path, nproc: int = 2) -> dict[int, set[tuple[int, int, str, str]]]:
    """Each rank's lockstep mismatches: (step, microbatch, site, phase)."""
    return {
        rank: {
            (e.step, e.fields["microbatch"], e.fields["site"], e.fields["phase"])
            for e in rank_events(replay, rank, "site_mismatch")
            if e.fields["mismatched"]
        }
        for rank in range(nproc)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("pipeline")
    profile = root / "stage1.toml"
    profile.write_text(STAGE1_FAULT, encoding="utf-8")
    link = root / "link.toml"
    link.write_text(LINK_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        profile=profile,
        golden=record(root / "golden"),  # checkpointed every 2 steps, the example's default
        again=record(root / "again"),
        suspect=record(root / "suspect", "--fault-profile", str(profile)),
        link=record(root / "link", "--fault-profile", str(link)),
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


def test_a_pipeline_run_recorded_twice_is_bit_identical_on_every_rank(runs: SimpleNamespace) -> None:
    comparison = compare_runs(runs.golden, runs.again)
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


def test_lockstep_replay_mismatches_at_the_faulty_site_only_and_a_healthy_twin_nowhere(runs: SimpleNamespace) -> None:
    """Stage 1's MLP at step 3, microbatch 2, forward and backward (its backward reads what its faulty forward
    saved); stage 0 receives golden gradients and stays clean. The replay log pairs and loads with its pair."""
    lockstep = replayed(runs.golden, runs.suspect, runs.root / "lockstep")
    site = {(3, 2, "blocks.1.mlp", "forward"), (3, 2, "blocks.1.mlp", "backward")}
    assert mismatched(lockstep) == {0: set(), 1: site}, mismatched(lockstep)
    # Every site and every receive of the step was compared, on both stages.
    compared = {(e.fields["site"], e.fields["phase"]) for e in rank_events(lockstep, 0, "site_mismatch")}
    assert ("pipeline.1-0.recv.out", "backward") in compared and ("blocks.0.attention", "forward") in compared
    rows = diffed_mismatches(runs.golden, runs.suspect, lockstep, runs.root / "replay.duckdb")
    assert rows == {(1, 3, "blocks.1.mlp", "forward"), (1, 3, "blocks.1.mlp", "backward")}, rows
    twin = replayed(runs.golden, runs.again, runs.root / "twin")
    assert mismatched(twin) == {0: set(), 1: set()}, mismatched(twin)
    compared = {
        (e.step, e.fields["microbatch"], e.fields["site"], e.fields["phase"])
        for e in rank_events(twin, 1, "site_mismatch")
    }
    assert site <= compared, compared  # the site was compared, and matched
    # The same comparisons as the faulty replay's, though the twin's step ran once (no second execution to compare).
    assert len(rank_events(twin, 0, "site_mismatch")) == len(rank_events(lockstep, 0, "site_mismatch")) == 20


def test_lockstep_charges_a_corrupted_receive_to_the_link_not_to_the_stage_that_computed_on_it(
    runs: SimpleNamespace,
) -> None:
    """What stage 1 received is compared with golden's and overwritten by it, so its attention and MLP compute on
    a golden activation: the link alone mismatches."""
    lockstep = replayed(runs.golden, runs.link, runs.root / "link-lockstep")
    assert mismatched(lockstep) == {0: set(), 1: {(3, 2, "pipeline.0-1.recv.out", "forward")}}, mismatched(lockstep)


def test_param_sync_replay_gives_every_stage_the_whole_models_noise(runs: SimpleNamespace) -> None:
    """Each stage compares the gradients of its own parameters; the total sums both stages' squares, as one
    process holding the whole model's gradients would."""
    out = replayed(runs.golden, runs.suspect, runs.root / "param-sync", mode="param-sync")
    noises = {rank: {e.fields["name"]: e.fields for e in rank_events(out, rank, "grad_noise")} for rank in (0, 1)}
    assert "embed.weight" in noises[0] and "head.weight" in noises[1] and "head.weight" not in noises[0], noises
    per_param = [n for rank in (0, 1) for name, n in noises[rank].items() if name != "*"]
    diff = math.sqrt(sum(n["diff_l2"] ** 2 for n in per_param))
    gold = math.sqrt(sum(n["golden_l2"] ** 2 for n in per_param))
    for rank in (0, 1):
        total = noises[rank]["*"]
        assert total["ratio"] == pytest.approx(diff / gold, rel=1e-9) and total["ratio"] > 0, (rank, total)
    assert any(n["diff_l2"] > 0 for n in noises[0].values()), noises[0]  # the fault reaches stage 0's gradients


def test_certify_names_the_checkpoint_before_the_fault_and_the_stage_it_entered_on(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """Both stages first differ at step 3, so the run's certified checkpoint is step 2's on both; the reason names
    stage 1, where the diff says the corruption entered, not stage 0 by the lower rank."""
    capsys.readouterr()
    args = [str(runs.suspect), "--golden", str(runs.golden), "--db", str(runs.root / "certify.duckdb")]
    assert main(["certify", *args]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(checkpoint_dir(runs.suspect, 2)), captured
    assert f"rank 1 diverged from {runs.golden} at step 3 (blocks.1.mlp forward)" in captured.err, captured.err


def test_an_incident_bundle_of_the_first_divergence_is_captured_on_its_stage_and_reproduces_there(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """Both stages rebuild step 3 and run it, golden and suspect; stage 1, which holds the site, writes the bundle.
    Under the fault's emulation (a stuck unit: the same rule, persistent) the bundle reproduces the suspect's bits,
    because it records the rank the site ran on, which the rule's ``ranks = [1]`` names."""
    bundle = runs.root / "incident"
    capsys.readouterr()
    args = ["--golden", str(runs.golden), "--suspect", str(runs.suspect), "--workload", WORKLOAD]
    assert main(["incident", *args, "--out", str(bundle)]) == 0
    assert "incident at step 3, microbatch 2, forward blocks.1.mlp" in capsys.readouterr().out
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["golden"]["rank"] == 1 and manifest["checkpoint"] == 2, manifest["golden"]
    assert manifest["suspect"]["inputs_were_golden"] and len(manifest["faults"]) == 2, manifest["suspect"]
    prints = manifest["fingerprints"]
    assert prints["golden"] == [prints["logged"]] and prints["suspect"] != prints["golden"], prints
    stuck = runs.root / "stage1-stuck.toml"
    stuck.write_text(STAGE1_FAULT + "persistent = true\n", encoding="utf-8")
    assert_persistent_under_emulation_only(bundle, stuck)


def test_a_4_stage_gpipe_run_is_bit_identical_its_stages_diverge_in_pipeline_order_and_it_replays(
    runs: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Stage 1's corrupted activation goes up to stages 2 and 3 in the same microbatch's forward (each first differs
    at what it received, in that order), and its gradient comes down to stage 0 in the backward. Replayed in
    lockstep on 4 ranks, the site alone mismatches."""
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
    lockstep = replayed(golden, suspect, tmp_path / "lockstep", nproc=4)
    site = {(3, 2, "blocks.1.mlp", "forward"), (3, 2, "blocks.1.mlp", "backward")}
    assert mismatched(lockstep, 4) == {0: set(), 1: site, 2: set(), 3: set()}, mismatched(lockstep, 4)


def test_a_corrupted_receive_is_told_apart_from_a_corrupted_stage(runs: SimpleNamespace) -> None:
    """A fault in what stage 1 received (the link, not a stage's compute): rank 1 first differs at its ``recv``
    while what rank 0 sent is healthy; rank 0 first differs at the gradient that came back."""
    order = first_divergences(runs.golden, runs.link, runs.root / "link.duckdb")
    assert order == [
        (1, 1, 3, 2, "pipeline.0-1.recv.out", "forward"),
        (2, 0, 3, 2, "pipeline.1-0.recv.out", "backward"),
    ], order
