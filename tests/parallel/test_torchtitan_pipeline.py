"""torchtitan's own debug Llama3 split by torchtitan's own ``pipeline_llm`` into 2 stages (1F1B) on 2 gloo ranks
(examples/torchtitan_pipeline.py): each stage traces its layers under their global names, the header records the
schedule and the stage-to-rank map; twice is bit-identical; a fault in stage 1's ``layers.4.feed_forward`` at step
3, pipeline microbatch 2, is the run's first divergence there, with stage 0, which only received its gradient,
later; lockstep replay (each stage restored from its own checkpoint) mismatches at that site only.

Launches: 3 recordings (golden, again, suspect) and one replay, on 2 ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra (make venv installs it)")

from sdc.cli import main  # noqa: E402
from tests.parallel.test_fsdp2 import rank1_fault  # noqa: E402
from tests.parallel.test_pipeline import first_divergences, mismatched  # noqa: E402
from tracer.compare import compare_runs  # noqa: E402
from tracer.log import LogReader, rank_dir  # noqa: E402
from tracer.log.records import Phase, TensorRecord  # noqa: E402

pytestmark = pytest.mark.slow  # ranks are processes

WORKLOAD = "examples.torchtitan_pipeline:build"
SITE = "layers.4.feed_forward"  # on stage 1 (layers 3 to 5)
STEPS = 5
STAGE1_FAULT = rank1_fault("matmul", sites="layers[.]4[.]feed_forward") + "microbatches = [2]\n"  # step 3, forward


def record(out: Path, *args: str) -> Path:
    command = ["record", "--workload", WORKLOAD, "--nproc", "2", "--steps", str(STEPS), "--quiet"]
    assert main([*command, "--checkpoint-every", "2", "--out", str(out), "--node-label", out.name, *args]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("titan-pp")
    (root / "stage1.toml").write_text(STAGE1_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        golden=record(root / "golden"),
        suspect=record(root / "suspect", "--fault-profile", str(root / "stage1.toml")),
    )


def test_each_torchtitan_stage_traces_its_layers_under_global_names_and_twice_is_bit_identical(
    runs: SimpleNamespace,
) -> None:
    for rank in (0, 1):
        header = LogReader(rank_dir(runs.golden, rank)).header
        parallel = header.extra["parallel"]
        assert (parallel["pp"], parallel["coords"]["pp"]) == (2, rank), parallel
        assert parallel["pipeline"] == {"schedule": "1F1B", "microbatches": 4, "stage_ranks": {"0": [0], "1": [1]}}
        layers = range(3 * rank, 3 * rank + 3)  # torchtitan's split: 3 layers a stage
        assert header.extra["sites"] == [f"layers.{n}.{s}" for n in layers for s in ("attention", "feed_forward")]
    # Once per pipeline microbatch, forward and backward, with the schedule's index: none of torch's shape
    # inference (a forward and a backward on meta tensors) in the log, which replay would not see again.
    fired = [
        (r.step, r.microbatch, r.phase)
        for r in LogReader(rank_dir(runs.golden, 1)).records()
        if isinstance(r, TensorRecord) and r.name == SITE
    ]
    passes = (Phase.FORWARD, Phase.BACKWARD)
    assert sorted(fired) == sorted((s, mb, p) for s in range(STEPS) for mb in range(4) for p in passes), fired
    comparison = compare_runs(runs.golden, record(runs.root / "again"))
    assert comparison.first is None and comparison.steps == STEPS, comparison


def test_a_fault_on_stage_1_goes_first_there_and_reaches_stage_0_later_through_the_gradient_it_sends(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    rows = first_divergences(runs.golden, runs.suspect, runs.root / "pp.duckdb")
    capsys.readouterr()
    assert rows == [
        (1, 1, 3, 2, SITE, "forward"),
        (2, 0, 3, 2, "pipeline.1-0.recv.out", "backward"),
    ], rows


def test_lockstep_replay_of_the_stages_mismatches_at_the_faulty_site_only(runs: SimpleNamespace) -> None:
    """Each stage restored from its own checkpoint (step 2's); what stage 0 receives is made golden, so it stays
    clean. The site's backward reads what its faulty forward saved: it mismatches too."""
    out = runs.root / "lockstep"
    args = ["--golden", str(runs.golden), "--suspect", str(runs.suspect), "--workload", WORKLOAD, "--steps", "3:4"]
    assert main(["replay", *args, "--nproc", "2", "--mode", "lockstep", "--out", str(out), "--quiet"]) == 0
    hits = mismatched(out)
    assert hits == {1: {(3, 2, SITE, "forward"), (3, 2, SITE, "backward")}, 0: set()}, hits
