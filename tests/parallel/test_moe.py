"""Expert parallelism on 2 gloo ranks (examples/torchrun_moe.py's factory through ``sdc record --nproc 2``): each
rank records its own experts under their global index and the all-to-all dispatch and combine; an expert with no
token records an empty output; twice is bit-identical; a fault in expert 3 (rank 1's) is found there first.

Launches: seven records (golden, again, suspect, one with few tokens, one with a fault in transit, two with the
default sites) and two replays (lockstep, param-sync)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sdc.cli import main
from tests.parallel.test_fsdp2 import diffed_mismatches, lockstep_hits, rank1_fault
from tests.parallel.test_ranks import query_rows, rank_events, summary
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

pytestmark = pytest.mark.slow  # ranks are processes

SITES = r"blocks\.\d+\.moe\.experts\.\d+"
WORKLOAD = ["--workload", "examples.torchrun_moe:build", "--nproc", "2", "--steps", "5", "--quiet"]
RECORD = [*WORKLOAD, "--sites", SITES]
EXPERT3_FAULT = rank1_fault("matmul", sites="blocks[.]1[.]moe[.]experts[.]3$")  # forward, step 3, rank 1
# What rank 0 receives from block 0's combine, corrupted in transit.
COMBINE_FAULT = rank1_fault("all_to_all", sites="blocks[.]0[.]moe[.]combine").replace("ranks = [1]", "ranks = [0]")


def record(out: Path, *args: str) -> Path:
    assert main(["record", "--out", str(out), "--node-label", out.name, "--checkpoint-every", "2", *RECORD, *args]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("moe")
    (root / "expert3.toml").write_text(EXPERT3_FAULT)
    return SimpleNamespace(
        root=root,
        golden=record(root / "golden"),
        suspect=record(root / "suspect", "--fault-profile", str(root / "expert3.toml")),
    )


def tensors(run: Path, rank: int) -> list[TensorRecord]:
    return [r for r in LogReader(rank_dir(run, rank)).records() if isinstance(r, TensorRecord)]


def test_each_rank_records_its_experts_by_global_index_and_the_all_to_alls(runs: SimpleNamespace) -> None:
    for rank in (0, 1):
        records = tensors(runs.golden, rank)
        names = {(r.name, r.phase) for r in records if r.phase in (Phase.FORWARD, Phase.BACKWARD)}
        experts = {f"blocks.{b}.moe.experts.{e}" for b in (0, 1) for e in (2 * rank, 2 * rank + 1)}
        exchanges = {
            f"blocks.{b}.moe.{point}.all_to_all.{side}"
            for b in (0, 1)
            for point in ("dispatch", "combine")
            for side in ("in", "out")
        }
        assert names == {(n, p) for n in experts | exchanges for p in (Phase.FORWARD, Phase.BACKWARD)}, names
        # Every expert a record in every microbatch of every step, forward and backward: no holes.
        for name in experts:
            for phase in (Phase.FORWARD, Phase.BACKWARD):
                seen = sorted((r.step, r.microbatch) for r in records if (r.name, r.phase) == (name, phase))
                assert seen == [(s, m) for s in range(5) for m in (0, 1)], (rank, name, phase, seen)
        held = {r.name for r in records if r.phase == Phase.PARAM and ".experts." in r.name}
        assert {n.split(".")[4] for n in held} == {str(2 * rank), str(2 * rank + 1)}, held


def test_an_expert_the_router_sent_no_token_records_an_empty_output(runs: SimpleNamespace) -> None:
    """Its site record is there, with zero rows (``float32[0,32]``): the log says "no token", not a hole. Two
    tokens a rank for 4 experts: some expert goes without in some microbatch."""
    run = record(runs.root / "few-tokens", "--set", "train.batch=1", "--set", "train.seq=2")
    empty = {
        (rank, r.step, r.microbatch, r.name, r.phase): r
        for rank in (0, 1)
        for r in tensors(run, rank)
        if ".experts." in r.name and r.meta.startswith("float32[0,")
    }
    assert empty, "no expert went without tokens in this run: make the test's run smaller"
    assert all(r.meta == "float32[0,32]" and r.l2 == 0.0 for r in empty.values()), empty
    # Its backward too: the gradient of no rows.
    assert {k[:4] for k in empty if k[4] == Phase.FORWARD} == {k[:4] for k in empty if k[4] == Phase.BACKWARD}


def test_an_expert_parallel_run_recorded_twice_is_bit_identical(runs: SimpleNamespace) -> None:
    again = record(runs.root / "again")
    comparison = compare_runs(runs.golden, again)
    assert comparison.first is None and comparison.steps == 5, comparison


def test_a_fault_in_expert_3_is_rank_1s_first_divergence_and_rank_0_sees_it_later(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    assert rank_events(runs.suspect, 1, "fault") and not rank_events(runs.suspect, 0, "fault")
    db = runs.root / "moe.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--db", str(db)]) == 0
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_site"]) == (
        1,
        3,
        "blocks.1.moe.experts.3 forward",
    ), row
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert firsts[1]["went_first"] and not firsts[0]["went_first"], firsts
    assert (firsts[1]["step"], firsts[1]["name"], firsts[1]["phase"]) == (3, "blocks.1.moe.experts.3", "forward")
    # Rank 0 only received it: the combine brought back expert 3's outputs for its own tokens.
    assert (firsts[0]["step"], firsts[0]["microbatch"], firsts[0]["name"], firsts[0]["phase"]) == (
        3,
        0,
        "blocks.1.moe.combine.all_to_all.out",
        "forward",
    ), firsts[0]


def test_lockstep_replay_mismatches_at_expert_3_on_rank_1_only(runs: SimpleNamespace) -> None:
    """Each rank replays its own experts; the all-to-alls carry golden outputs, so rank 0 stays clean."""
    hits = lockstep_hits(runs.golden, runs.suspect, "examples.torchrun_moe:build", runs.root / "lockstep")
    # The site only: its backward reads the activations its own faulty forward saved, so it mismatches too.
    site = "blocks.1.moe.experts.3"
    assert hits == {1: {(3, site, "forward"), (3, site, "backward")}, 0: set()}, hits
    rows = diffed_mismatches(runs.golden, runs.suspect, runs.root / "lockstep", runs.root / "replay.duckdb")
    assert rows == {(1, 3, site, "forward"), (1, 3, site, "backward")}, rows  # the replay log pairs and loads


def test_param_sync_replay_gives_each_rank_the_noise_of_its_own_gradients(runs: SimpleNamespace) -> None:
    """Rank 1's fault reaches rank 0 through the combine, so both ranks' gradients are noisy; each rank's ratio
    covers the gradients it holds (its experts and the replicated rest), not the whole model's."""
    out = runs.root / "param-sync"
    args = ["--golden", str(runs.golden), "--suspect", str(runs.suspect), "--workload", "examples.torchrun_moe:build"]
    assert main(["replay", *args, "--nproc", "2", "--steps", "3:4", "--mode", "param-sync", "--out", str(out)]) == 0
    ratios = [
        [e.fields["ratio"] for e in rank_events(out, rank, "grad_noise") if e.fields["name"] == "*"] for rank in (0, 1)
    ]
    assert all(len(r) == 1 and r[0] > 0 for r in ratios), ratios
    assert ratios[0] != ratios[1], ratios  # other experts: other gradients


def test_a_fault_in_what_rank_0_receives_from_the_combine_is_a_communication_fault(runs: SimpleNamespace) -> None:
    """The all-to-all's input is the golden one on rank 0, its output is not: corrupted in transit."""
    (runs.root / "combine.toml").write_text(COMBINE_FAULT)
    suspect = record(runs.root / "combine", "--fault-profile", str(runs.root / "combine.toml"))
    first = compare_runs(runs.golden, suspect).first
    assert first is not None, "the fault did not fire"
    assert (first.rank, first.step, first.name) == (0, 3, "blocks.0.moe.combine.all_to_all.out"), first


def test_with_the_default_sites_the_combine_still_names_the_rank_that_went_first(runs: SimpleNamespace) -> None:
    """Default sites are each block's attention and whole ``moe`` (after the combine): no expert is a site, but
    the all-to-all's input says which rank's experts sent corrupted rows."""
    profile = str(runs.root / "expert3.toml")
    golden, suspect = (
        main(["record", "--out", str(runs.root / name), "--checkpoint-every", "0", *WORKLOAD, *more]) == 0
        for name, more in (("default", []), ("default-sick", ["--fault-profile", profile]))
    )
    assert golden and suspect
    assert LogReader(rank_dir(runs.root / "default", 1)).header.extra["sites"] == [
        f"blocks.{b}.{part}" for b in (0, 1) for part in ("attention", "moe")
    ]
    first = compare_runs(runs.root / "default", runs.root / "default-sick").first
    assert first is not None and (first.rank, first.step, first.name) == (1, 3, "blocks.1.moe.combine.all_to_all.in")
