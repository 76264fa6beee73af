"""torchtitan's own debug Llama3 under its own ``parallelize_llama`` (FSDP2) on 2 gloo ranks
(examples/torchtitan_llama3.py), recorded with ``sdc record --nproc 2``: twice bit-identical, a fault in rank 1's
``layers.1.feed_forward`` at step 3 is found there first by ``sdc diff``, and ``sdc replay --mode lockstep``
mismatches at that site only.

Launches: 3 recordings (golden, again, suspect) and one replay, each of 2 ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra (make venv installs it)")

from sdc.cli import main  # noqa: E402
from tests.parallel.test_fsdp2 import STEPS, lockstep_hits, rank1_fault  # noqa: E402
from tests.parallel.test_ranks import summary  # noqa: E402
from tracer.compare import compare_runs  # noqa: E402
from tracer.log import LogReader, rank_dir  # noqa: E402
from tracer.sharding import shards_of  # noqa: E402

pytestmark = pytest.mark.slow  # ranks are processes

WORKLOAD = "examples.torchtitan_llama3:build"
SITE = "layers.1.feed_forward"
# The SiLU of the SwiGLU runs on rank 1's own batch: FSDP2 keeps the forward per rank, so the fault stays there.
RANK1_FAULT = rank1_fault("silu", sites="layers[.]1[.]feed_forward")


def record(out: Path, *args: str) -> Path:
    assert (
        main(["record", "--workload", WORKLOAD, "--nproc", "2", "--steps", STEPS, "--out", str(out), "--quiet", *args])
        == 0
    )
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("torchtitan")
    profile = root / "rank1.toml"
    profile.write_text(RANK1_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        golden=record(root / "golden", "--node-label", "golden"),
        suspect=record(root / "suspect", "--node-label", "sick", "--fault-profile", str(profile)),
    )


def test_torchtitans_llama3_under_its_fsdp2_records_its_shards_and_twice_is_bit_identical(
    runs: SimpleNamespace, tmp_path: Path
) -> None:
    comparison = compare_runs(runs.golden, record(tmp_path / "again", "--node-label", "golden"))
    assert comparison.first is None and comparison.steps == int(STEPS), comparison
    for rank in (0, 1):
        header = LogReader(rank_dir(runs.golden, rank)).header
        assert header.extra["sites"] == [f"layers.{n}.{s}" for n in range(6) for s in ("attention", "feed_forward")]
        w1 = shards_of(header.extra)["layers.1.feed_forward.w1.weight"]  # torchtitan's fully_shard: rows split
        assert (w1.mesh_dims, w1.placements, w1.slice()) == (
            ("fsdp",),
            ("Shard(0)",),
            ("[0:384, 0:256]", "[384:768, 0:256]")[rank],
        )


def test_a_fault_in_rank_1s_feed_forward_is_its_first_divergence(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    db = runs.root / "titan.duckdb"
    assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--db", str(db)]) == 0
    capsys.readouterr()
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        3,
        0,
        f"{SITE} forward",
    ), row


def test_lockstep_replay_mismatches_at_the_faulty_site_only(runs: SimpleNamespace) -> None:
    hits = lockstep_hits(runs.golden, runs.suspect, WORKLOAD, runs.root / "lockstep")
    # Backward too, at the same site: SwiGLU's product saved the corrupted SiLU output, and its gradient w.r.t. w3's
    # branch is computed from it, inside the site.
    assert hits == {1: {(3, SITE, "forward"), (3, SITE, "backward")}, 0: set()}, hits
