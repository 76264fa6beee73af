"""torchtitan's own debug Llama3 under its own ``parallelize_llama`` (examples/torchtitan_llama3.py), recorded with
``sdc record`` under FSDP2 x TP (2 x 2, sequence parallel) on 4 gloo ranks: twice bit-identical, a fault in rank 1's
``layers.1.feed_forward`` at step 3 is found there first by ``sdc diff``, and ``sdc replay --mode lockstep``
mismatches at that site only. (FSDP2 alone on 2 ranks is the same parallelize with TP off: its own set added 75 s to
the suite and tested nothing this one does not.)

Launches: 3 recordings (golden, again, suspect) and one replay, on 4 ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra (make venv installs it)")

from sdc.cli import main  # noqa: E402
from tests.parallel.test_fsdp2 import STEPS, rank1_fault  # noqa: E402
from tests.parallel.test_ranks import rank_events, summary  # noqa: E402
from tracer.compare import compare_runs  # noqa: E402
from tracer.log import LogReader, rank_dir  # noqa: E402
from tracer.sharding import shards_of  # noqa: E402

pytestmark = pytest.mark.slow  # ranks are processes

WORKLOAD = "examples.torchtitan_llama3:build"
SITE = "layers.1.feed_forward"
# The SiLU of the SwiGLU runs on rank 1's own batch: FSDP2 keeps the forward per rank, so the fault stays there.
RANK1_FAULT = rank1_fault("silu", sites="layers[.]1[.]feed_forward")


FSDP2_TP = ("--nproc", "4", "--set", "parallel.tp=2")


def record(out: Path, *args: str, ranks: tuple[str, ...]) -> Path:
    command = ["record", "--workload", WORKLOAD, *ranks, "--steps", STEPS, "--out", str(out), "--quiet", *args]
    assert main(command) == 0
    return out


def recordings(root: Path, ranks: tuple[str, ...]) -> SimpleNamespace:
    profile = root / "rank1.toml"
    profile.write_text(RANK1_FAULT, encoding="utf-8")
    return SimpleNamespace(
        root=root,
        ranks=ranks,
        golden=record(root / "golden", "--node-label", "golden", ranks=ranks),
        suspect=record(root / "suspect", "--node-label", "sick", "--fault-profile", str(profile), ranks=ranks),
    )


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return recordings(tmp_path_factory.mktemp("torchtitan-tp"), FSDP2_TP)


def test_under_fsdp2_and_tensor_parallel_on_4_ranks_twice_is_bit_identical(
    tp_runs: SimpleNamespace, tmp_path: Path
) -> None:
    comparison = compare_runs(tp_runs.golden, record(tmp_path / "again", "--node-label", "golden", ranks=FSDP2_TP))
    assert comparison.first is None and comparison.steps == int(STEPS), comparison
    header = LogReader(rank_dir(tp_runs.golden, 1)).header
    assert header.extra["sites"] == [f"layers.{n}.{s}" for n in range(6) for s in ("attention", "feed_forward")]
    assert header.extra["parallel"] == {"dp": 2, "tp": 2, "sp": True, "coords": {"dp": 0, "tp": 1}}
    w2 = shards_of(header.extra)["layers.1.feed_forward.w2.weight"]  # FSDP2's rows x TP's columns
    assert (w2.mesh_dims, w2.placements, w2.slice()) == (("fsdp", "tp"), ("Shard(0)", "Shard(1)"), "[0:128, 384:768]")


def test_under_fsdp2_and_tensor_parallel_a_fault_is_found_on_its_rank_and_replayed_at_its_site(
    tp_runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """Rank 1's SiLU works on its half of the hidden units: its feed-forward output goes first; the other ranks
    diverge later. Lockstep on 4 ranks mismatches at that site only: on rank 1, and on rank 0 where the corrupted
    token's row reaches it, as ``w2``'s reduce-scatter (sequence parallel) is inside the site; the other replica
    (ranks 2, 3) replays clean."""
    db = tp_runs.root / "titan-tp.duckdb"
    assert main(["diff", "--golden", str(tp_runs.golden), "--suspect", str(tp_runs.suspect), "--db", str(db)]) == 0
    capsys.readouterr()
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        3,
        0,
        f"{SITE} forward",
    ), row
    out = tp_runs.root / "lockstep"
    replay = ["replay", "--golden", str(tp_runs.golden), "--suspect", str(tp_runs.suspect), "--workload", WORKLOAD]
    assert main([*replay, "--nproc", "4", "--steps", "3:4", "--mode", "lockstep", "--out", str(out), "--quiet"]) == 0
    hits = {
        rank: {
            (e.step, e.fields["site"], e.fields["phase"])
            for e in rank_events(out, rank, "site_mismatch")
            if e.fields["mismatched"]
        }
        for rank in range(4)
    }
    assert (3, SITE, "forward") in hits[1] and not hits[2] and not hits[3], hits
    assert {site for rank in hits.values() for _, site, _ in rank} == {SITE}, hits
    assert hits[0] | hits[1] <= {(3, SITE, "forward"), (3, SITE, "backward")}, hits
    assert hits[2] == hits[3] == set(), hits
