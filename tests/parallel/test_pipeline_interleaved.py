"""An interleaved pipeline (``torch.distributed.pipelining``'s ScheduleInterleaved1F1B: 2 gloo ranks x 2 stages
each, stage s on rank s % 2) recorded by ``sdc record --nproc 2 --workload examples.torchrun_pipeline:build``: each
rank traces both its stages under the whole model's names, the header records the schedule, its microbatches, the
stage-to-rank map and each stage's modules; two runs are bit-identical; a fault in stage 2's MLP (on rank 0) at step
3, pipeline microbatch 1 is the first divergence at rank 0, stage 2, with stage 3 (rank 1), which only received it,
later; ``sdc replay --nproc 2`` in lockstep mismatches at that site only.

Launches: 3 two-rank record jobs (golden, again, suspect) and one two-rank replay."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from examples.torchrun_pipeline import build
from tests.parallel.test_fsdp2 import rank1_fault
from tests.parallel.test_pipeline import first_divergences, mismatched, record, replayed
from tests.parallel.test_ranks import query_rows, rank_events
from tracer import SdcError
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

pytestmark = pytest.mark.slow  # the record jobs launch ranks as processes

INTERLEAVED = ("--set", "parallel.schedule=Interleaved1F1B", "--set", "parallel.stages_per_rank=2")
STEPS, MICROBATCHES = 5, 4
# Block 2's MLP (stage 2, on rank 0), step 3, pipeline microbatch 1
STAGE2_FAULT = rank1_fault("matmul", sites="blocks[.]2[.]mlp").replace("ranks = [1]", "ranks = [0]") + (
    "microbatches = [1]\n"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("interleaved")
    profile = root / "stage2.toml"
    profile.write_text(STAGE2_FAULT, encoding="utf-8")
    golden = record(root / "golden", *INTERLEAVED)
    suspect = record(root / "suspect", *INTERLEAVED, "--fault-profile", str(profile))
    return SimpleNamespace(
        root=root,
        golden=golden,
        again=record(root / "again", *INTERLEAVED),
        suspect=suspect,
        lockstep=replayed(golden, suspect, root / "lockstep"),
    )


def test_each_rank_traces_its_stages_under_global_names_and_the_header_maps_stages_to_ranks(
    runs: SimpleNamespace,
) -> None:
    for rank in (0, 1):
        header = LogReader(rank_dir(runs.golden, rank)).header
        assert header.extra["parallel"]["pipeline"] == {
            "schedule": "Interleaved1F1B",
            "microbatches": MICROBATCHES,
            "stage_ranks": {"0": [0], "1": [1], "2": [0], "3": [1]},
            "stages_per_rank": 2,
            "stage_modules": {
                "0": ["embed", "blocks.0"],
                "1": ["blocks.1"],
                "2": ["blocks.2"],
                "3": ["blocks.3", "head"],
            },
        }, header.extra["parallel"]
        held = (rank, rank + 2)
        assert header.extra["sites"] == [f"blocks.{b}.{m}" for b in held for m in ("attention", "mlp")]
    records = [r for r in LogReader(rank_dir(runs.golden, 0)).records() if isinstance(r, TensorRecord)]
    # Both of rank 0's stages fire once per pipeline microbatch, forward and backward, with the schedule's index.
    for site in ("blocks.0.mlp", "blocks.2.mlp"):
        fired = {(r.step, r.microbatch, r.phase) for r in records if r.name == site}
        passes = (Phase.FORWARD, Phase.BACKWARD)
        assert fired == {(s, mb, p) for s in range(STEPS) for mb in range(MICROBATCHES) for p in passes}, site
    # Rank 0's links: stage 0 sends to stage 1, stage 2 receives from stage 1 and sends to stage 3 (and back).
    links = {r.name for r in records if r.name.startswith("pipeline.")}
    assert links == {
        "pipeline.0-1.send.in",
        "pipeline.1-0.recv.out",
        "pipeline.1-2.recv.out",
        "pipeline.2-1.send.in",
        "pipeline.2-3.send.in",
        "pipeline.3-2.recv.out",
    }, links
    other = [r for r in LogReader(rank_dir(runs.golden, 1)).records() if isinstance(r, TensorRecord)]

    def sent(rs: list[TensorRecord], name: str) -> dict[tuple[int, int], str]:
        return {(r.step, r.microbatch): r.fingerprint for r in rs if r.name == name}

    # What stage 1 (rank 1) sent is what stage 2 (rank 0) received, and back.
    assert sent(other, "pipeline.1-2.send.in") == sent(records, "pipeline.1-2.recv.out") != {}
    assert sent(records, "pipeline.2-1.send.in") == sent(other, "pipeline.2-1.recv.out") != {}


def test_an_interleaved_run_recorded_twice_is_bit_identical_on_every_rank(runs: SimpleNamespace) -> None:
    comparison = compare_runs(runs.golden, runs.again)
    assert comparison.first is None and comparison.steps == STEPS, comparison


def test_a_fault_in_stage_2_is_rank_0s_first_divergence_and_stage_3_only_received_it(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    db = runs.root / "interleaved.duckdb"
    capsys.readouterr()
    order = first_divergences(runs.golden, runs.suspect, db)
    out = capsys.readouterr().out
    assert order == [
        (1, 0, 3, 1, "blocks.2.mlp", "forward"),
        (2, 1, 3, 1, "pipeline.2-3.recv.out", "forward"),
    ], order
    assert "first divergence: rank 0 (stage 2) (went first), step 3, microbatch 1, forward blocks.2.mlp\n" in out, out
    assert "first divergence: rank 1 (stage 3) (#2), step 3, microbatch 1, forward pipeline.2-3.recv.out" in out, out
    stages = {r["rank"]: r["stage"] for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert stages == {0: 2, 1: 3}, stages
    # The quick check (verify-determinism, replay --at-first-divergence, incident) orders the stages as the diff does,
    # though rank 1 records its receive earlier in its own log than rank 0 its MLP.
    first = compare_runs(runs.golden, runs.suspect).first
    assert first is not None and (first.rank, first.step, first.microbatch, first.name, first.phase) == (
        0,
        3,
        1,
        "blocks.2.mlp",
        Phase.FORWARD,
    ), first


def test_lockstep_replay_on_2_ranks_mismatches_at_the_faulty_site_only(runs: SimpleNamespace) -> None:
    """Each rank restores both its stages from its own checkpoint (step 2's); stage 2's MLP at step 3, microbatch 1
    mismatches forward and backward (its backward reads what its faulty forward saved), nothing else does."""
    site = {(3, 1, "blocks.2.mlp", "forward"), (3, 1, "blocks.2.mlp", "backward")}
    assert mismatched(runs.lockstep) == {0: site, 1: set()}, mismatched(runs.lockstep)
    compared = {(e.fields["site"], e.fields["phase"]) for e in rank_events(runs.lockstep, 1, "site_mismatch")}
    assert ("pipeline.2-3.recv.out", "forward") in compared and ("blocks.3.mlp", "backward") in compared, compared


def test_several_stages_per_rank_need_an_interleaved_schedule() -> None:
    """Refused in one line when the workload is built, before any stage exists."""
    config = {"parallel": {"schedule": "1F1B", "stages_per_rank": 2}}
    with pytest.raises(SdcError, match="several stages per rank need an interleaved schedule") as refused:
        build(config, torch.device("cpu"))
    assert "\n" not in str(refused.value), refused.value
