"""torchtitan's own debug Qwen3-MoE under its own ``parallelize_qwen3`` with expert parallelism on 2 gloo ranks
(examples/torchtitan_moe.py, cut to 2 layers of 4 experts): each rank records its experts under their global index
and the all-to-alls; twice is bit-identical; a fault in expert 3 (rank 1's) is the run's first divergence there,
rank 0 later; lockstep replay mismatches at that expert only.

Launches: 3 recordings (golden, again, suspect) and one replay, on 2 ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra (make venv installs it)")

from sdc.cli import main  # noqa: E402
from tests.parallel.test_fsdp2 import lockstep_hits, rank1_fault  # noqa: E402
from tests.parallel.test_ranks import query_rows, rank_events, summary  # noqa: E402
from tracer.compare import compare_runs  # noqa: E402
from tracer.log import LogReader, rank_dir  # noqa: E402
from tracer.log.records import Phase, TensorRecord  # noqa: E402
from tracer.sharding import shards_of  # noqa: E402

pytestmark = pytest.mark.slow  # ranks are processes

WORKLOAD = "examples.torchtitan_moe:build"
SITES = r"layers\.\d+\.moe\.experts\.\d+"
SITE = "layers.1.moe.experts.3"  # held by rank 1 (experts 2 and 3)
STEPS = 5
EXPERT3_FAULT = rank1_fault("matmul", sites="layers[.]1[.]moe[.]experts[.]3$")  # forward, step 3, rank 1


def record(out: Path, *args: str) -> Path:
    command = ["record", "--workload", WORKLOAD, "--nproc", "2", "--steps", str(STEPS), "--sites", SITES, "--quiet"]
    assert main([*command, "--checkpoint-every", "2", "--out", str(out), "--node-label", out.name, *args]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("titan-moe")
    (root / "expert3.toml").write_text(EXPERT3_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        golden=record(root / "golden"),
        suspect=record(root / "suspect", "--fault-profile", str(root / "expert3.toml")),
    )


def test_each_rank_records_its_experts_by_global_index_and_the_all_to_alls(runs: SimpleNamespace) -> None:
    for rank in (0, 1):
        records = [r for r in LogReader(rank_dir(runs.golden, rank)).records() if isinstance(r, TensorRecord)]
        names = {(r.name, r.phase) for r in records if r.phase in (Phase.FORWARD, Phase.BACKWARD)}
        experts = {f"layers.{n}.moe.experts.{e}" for n in (0, 1) for e in (2 * rank, 2 * rank + 1)}
        exchanges = {
            f"layers.{n}.moe.{point}.all_to_all.{side}"
            for n in (0, 1)
            for point in ("dispatch", "combine")
            for side in ("in", "out")
        }
        assert names == {(n, p) for n in experts | exchanges for p in (Phase.FORWARD, Phase.BACKWARD)}, names
        for name in experts:  # a record in every microbatch of every step, also one with no token: no holes
            seen = sorted((r.step, r.microbatch) for r in records if (r.name, r.phase) == (name, Phase.FORWARD))
            assert seen == [(s, m) for s in range(STEPS) for m in (0, 1)], (rank, name, seen)
        # torchtitan's grouped weights, this rank's half of the experts (expert parallel: Shard(0) over ``ep``).
        w1 = shards_of(LogReader(rank_dir(runs.golden, rank)).header.extra)[
            "layers.1.moe.routed_experts.inner_experts.w1_EFD"
        ]
        assert (w1.global_shape[0], w1.offsets[0], w1.local_shape[0]) == (4, 2 * rank, 2), w1


def test_an_expert_parallel_torchtitan_moe_recorded_twice_is_bit_identical(runs: SimpleNamespace) -> None:
    comparison = compare_runs(runs.golden, record(runs.root / "again"))
    assert comparison.first is None and comparison.steps == STEPS, comparison


def test_a_fault_in_expert_3_is_rank_1s_first_divergence_and_rank_0_sees_it_later(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    assert rank_events(runs.suspect, 1, "fault") and not rank_events(runs.suspect, 0, "fault")
    db = runs.root / "moe.duckdb"
    assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--db", str(db)]) == 0
    capsys.readouterr()
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_site"]) == (1, 3, f"{SITE} forward"), row
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert firsts[1]["went_first"] and not firsts[0]["went_first"], firsts
    assert (firsts[1]["step"], firsts[1]["name"], firsts[1]["phase"]) == (3, SITE, "forward"), firsts[1]
    # Rank 0 only received it: the combine brought back expert 3's outputs for its own tokens.
    assert (firsts[0]["step"], firsts[0]["name"], firsts[0]["phase"]) == (
        3,
        "layers.1.moe.combine.all_to_all.out",
        "forward",
    ), firsts[0]


def test_lockstep_replay_mismatches_at_expert_3_on_rank_1_only(runs: SimpleNamespace) -> None:
    """Each rank replays its own experts; the all-to-alls carry golden outputs, so rank 0 stays clean. The site's
    backward reads the activations its own faulty forward saved, so it mismatches too."""
    hits = lockstep_hits(runs.golden, runs.suspect, WORKLOAD, runs.root / "lockstep")
    assert hits == {1: {(3, SITE, "forward"), (3, SITE, "backward")}, 0: set()}, hits
