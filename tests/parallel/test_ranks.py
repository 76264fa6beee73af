"""Multi-rank runs end to end: record, verify-determinism, diff and replay across 2 and 4 CPU ranks.

Every rank is its own process on gloo with one thread; ``--rank-timeout`` makes a hung
rank fail the test instead of hanging it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest

from analysis import queries
from sdc.cli import main
from tests.sdc.test_cli import sdc
from tests.support import ONE_FLIP
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, TensorRecord

pytestmark = pytest.mark.slow  # every test launches ranks as processes

QUERY = Path(__file__).resolve().parents[2] / "analysis" / "queries" / "rq1_first_divergence_by_rank.sql"
COMMON = [
    "--set",
    "model.n_layers=2",
    "--set",
    "data.batch_size=2",
    "--set",
    "data.seq_len=32",
    "--set",
    "train.threads=1",
    "--quiet",
    "--rank-timeout",
    "120",
]
TP2 = ["--nproc", "2", "--tp", "2", "--sp"]
RECORD = ["--steps", "3", "--checkpoint-every", "2"]


def one_flip(rank: int, op: str = "matmul", site: str = r"layers\\.1\\.feed_forward") -> str:
    """`ONE_FLIP` (one exponent flip in each forward matmul of layers.1.feed_forward) on ``rank`` alone at step 1,
    or in the output of another op at another point."""
    text = ONE_FLIP.replace("steps = [3]", f"steps = [1]\nranks = [{rank}]").replace('"matmul"', f'"{op}"')
    return text.replace(r"layers\\.1\\.feed_forward", site)


def record(out: Path, *args: str) -> Path:
    assert main(["record", "--out", str(out), "--node-label", out.name, *COMMON, *args]) == 0
    return out


def rank_events(run: Path, rank: int, kind: str) -> list[EventRecord]:
    return [r for r in LogReader(rank_dir(run, rank)).records() if isinstance(r, EventRecord) and r.kind == kind]


def fingerprints(run: Path, rank: int, step: int) -> dict[tuple[int, str, int], int]:
    return {
        (r.microbatch, r.name, int(r.phase)): r.fingerprint
        for r in LogReader(rank_dir(run, rank)).records()
        if isinstance(r, TensorRecord) and r.step == step
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("ranks")
    (root / "rank1.toml").write_text(one_flip(1))
    # What rank 0 receives from layers.0's attention reduce-scatter.
    (root / "link.toml").write_text(one_flip(0, "reduce_scatter", r"layers\\.0\\.attention_out"))
    golden = record(root / "golden", *TP2, *RECORD)
    suspect = record(root / "suspect", *TP2, *RECORD, "--fault-profile", str(root / "rank1.toml"))
    return SimpleNamespace(root=root, golden=golden, suspect=suspect)


def test_fault_on_rank_1_alone_shows_up_first_on_rank_1(runs: SimpleNamespace) -> None:
    first = compare_runs(runs.golden, runs.suspect).first
    assert first is not None and (first.rank, first.step, first.name) == (1, 1, "layers.1.feed_forward")
    assert rank_events(runs.suspect, 1, "fault") and not rank_events(runs.suspect, 0, "fault")

    db = runs.root / "study.duckdb"
    assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--db", str(db)]) == 0
    con = duckdb.connect(str(db), read_only=True)
    rows = con.sql(QUERY.read_text()).fetchall()
    columns = [d[0] for d in con.sql(QUERY.read_text()).description]
    by_rank = {row[columns.index("rank")]: dict(zip(columns, row)) for row in rows}
    assert by_rank[1]["went_first"] and not by_rank[0]["went_first"]
    # Rank 0 sees the fault only when rank 1's partial sum reaches it through the reduce-scatter.
    assert by_rank[0]["name"] == "layers.1.feed_forward_out.reduce_scatter.out"
    assert (by_rank[0]["step"], by_rank[0]["microbatch"]) == (by_rank[1]["step"], by_rank[1]["microbatch"])
    con.close()
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_site"]) == (1, 1, "layers.1.feed_forward forward")


def summary(db: Path) -> dict:
    (row,) = query_rows(db, "summary")
    return row


def query_rows(db: Path, name: str) -> list[dict]:
    return queries.run(db, name).records()


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The steps of `runs` on 2 data-parallel ranks instead: ``golden``, and ``suspect`` with the fault on rank 1."""
    root = tmp_path_factory.mktemp("dp2")
    (root / "rank1.toml").write_text(one_flip(1))
    args = ["--nproc", "2", "--dp", "2", *RECORD]
    return SimpleNamespace(
        golden=record(root / "golden", *args),
        suspect=record(root / "suspect", *args, "--fault-profile", str(root / "rank1.toml")),
    )


def test_data_parallel_fault_on_rank_1_is_the_first_divergence_of_the_summary(
    dp2: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Rank 0's gradients differ after the step's all-reduce; rank 1's forward differed before it."""
    golden, suspect = dp2.golden, dp2.suspect
    db = tmp_path / "study.duckdb"
    capsys.readouterr()
    assert main(["diff", "--golden", str(golden), "--suspect", str(suspect), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    firsts = {r["rank"]: r for r in query_rows(db, "rq1_first_divergence_by_rank")}
    assert firsts[0]["phase"] == "grad" and firsts[1]["phase"] == "forward", firsts
    # The gradients are all-reduced after the step's microbatches: no microbatch, rather than a misleading 0.
    assert firsts[0]["microbatch"] is None
    con = duckdb.connect(str(db), read_only=True)
    labels = con.sql("SELECT DISTINCT phase, microbatch FROM event_diffs WHERE phase IN ('grad', 'param')").fetchall()
    con.close()
    assert sorted(labels) == [("grad", None), ("param", None)]
    assert firsts[1]["went_first"] and not firsts[0]["went_first"]
    row = summary(db)
    assert (row["first_rank"], row["first_step"], row["first_microbatch"], row["first_site"]) == (
        1,
        1,
        0,
        "layers.1.feed_forward forward",
    )
    assert "first divergence: rank 1 (went first), step 1, microbatch 0, forward layers.1.feed_forward" in out, out
    assert "first divergence: rank 0 (#2), step 1, the whole step, grad " in out, out


def test_corruption_in_a_collective_is_told_apart_from_compute(runs: SimpleNamespace) -> None:
    link = record(
        runs.root / "link",
        *TP2,
        "--steps",
        "2",
        "--checkpoint-every",
        "0",
        "--fault-profile",
        str(runs.root / "link.toml"),
    )
    first = compare_runs(runs.golden, link).first
    assert first is not None and (first.rank, first.step) == (0, 1)
    assert first.name == "layers.0.attention_out.reduce_scatter.out"
    golden, faulty = fingerprints(runs.golden, 0, 1), fingerprints(link, 0, 1)
    forward = 0
    for name in ("layers.0.attention", "layers.0.attention_out.reduce_scatter.in"):
        assert golden[(0, name, forward)] == faulty[(0, name, forward)], f"{name}: compute was healthy"
    assert golden[(0, first.name, forward)] != faulty[(0, first.name, forward)]
    assert rank_events(link, 0, "fault")[0].fields["op"] == "reduce_scatter"


def test_replay_both_modes_across_ranks_and_diff_them(runs: SimpleNamespace, capsys: pytest.CaptureFixture) -> None:
    profile = str(runs.root / "rank1.toml")
    replays = {}
    for mode in ("lockstep", "param-sync"):
        out = replays[mode] = runs.root / f"replay-{mode}"
        assert (
            main(
                [
                    "replay",
                    "--golden",
                    str(runs.golden),
                    "--fault-profile",
                    profile,
                    "--steps",
                    "1:2",
                    "--mode",
                    mode,
                    "--out",
                    str(out),
                    "--quiet",
                    "--rank-timeout",
                    "120",
                ]
            )
            == 0
        )
    assert "2 rank(s)" in capsys.readouterr().out
    # Lockstep overwrites each site's partial output before its reduce-scatter: rank 0 only ever
    # receives golden partials, so the fault stays on rank 1.
    worst = {
        rank: max(e.fields["frequency"] for e in rank_events(replays["lockstep"], rank, "site_mismatch"))
        for rank in (0, 1)
    }
    assert worst[0] == 0.0 and worst[1] > 0.0
    hit = {e.fields["site"] for e in rank_events(replays["lockstep"], 1, "site_mismatch") if e.fields["frequency"]}
    assert hit == {"layers.1.feed_forward"}
    # Parameter sync lets the fault flow through the collectives: both ranks' gradients are noisy.
    for rank in (0, 1):
        total = [e for e in rank_events(replays["param-sync"], rank, "grad_noise") if e.fields["name"] == "*"]
        assert len(total) == 1 and total[0].fields["ratio"] > 0
    db = runs.root / "replays.duckdb"
    assert (
        main(
            [
                "diff",
                "--golden",
                str(runs.golden),
                "--suspect",
                str(runs.suspect),
                "--db",
                str(db),
                "--replay",
                str(replays["lockstep"]),
                "--replay",
                str(replays["param-sync"]),
            ]
        )
        == 0
    )
    con = duckdb.connect(str(db), read_only=True)
    assert con.sql("select distinct rank from site_mismatch order by rank").fetchall() == [(0,), (1,)]
    assert con.sql("select distinct rank from grad_noise order by rank").fetchall() == [(0,), (1,)]


def test_verify_determinism_across_ranks(capsys: pytest.CaptureFixture) -> None:
    assert main(["verify-determinism", *COMMON, *TP2, "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bit-identical:") and "on 2 ranks" in out


def test_runs_with_different_layouts_are_refused(
    runs: SimpleNamespace, dp2: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    data_parallel = dp2.golden
    assert (
        main(
            [
                "diff",
                "--golden",
                str(runs.golden),
                "--suspect",
                str(data_parallel),
                "--db",
                str(runs.root / "refused.duckdb"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "parallel.dp: 1 vs 2" in err and "parallel.tp: 2 vs 1" in err and "parallel.sp: True vs False" in err
    assert (
        main(
            [
                "replay",
                "--golden",
                str(runs.golden),
                "--suspect",
                str(data_parallel),
                "--steps",
                "1",
                "--out",
                str(runs.root / "refused"),
                "--quiet",
            ]
        )
        == 1
    )
    assert "parallel.tp: 2 vs 1" in capsys.readouterr().err


def test_an_incident_of_a_tensor_parallel_run_is_refused_in_one_line(
    runs: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """A tensor-parallel site runs on every rank at once, so no one rank's capture is the site's: only single-rank
    runs and pipeline stages (tests/parallel/test_pipeline.py) are captured."""
    capsys.readouterr()
    out = runs.root / "incident"
    assert main(["incident", "--golden", str(runs.golden), "--suspect", str(runs.suspect), "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert "recorded on 2 ranks" in err and "single-rank runs and pipeline stages only" in err, err
    assert "\n" not in err and not out.exists(), err


def test_a_failing_rank_reaches_the_user_as_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "nowhere.toml"
    profile.write_text(one_flip(1, site="nowhere"))
    result = sdc("record", "--out", str(tmp_path / "x"), *COMMON, *TP2, "--steps", "1", "--fault-profile", str(profile))
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("sdc: warning: ")]  # one line each
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("sdc: error: rank "), result.stderr
    assert "matches no module path" in lines[0]


def test_four_ranks_data_tensor_and_sequence_parallel(tmp_path: Path) -> None:
    golden = record(
        tmp_path / "golden", "--nproc", "4", "--dp", "2", "--tp", "2", "--sp", "--steps", "2", "--checkpoint-every", "1"
    )
    coords = [LogReader(rank_dir(golden, r)).header.extra["parallel"]["coords"] for r in range(4)]
    assert coords == [{"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    profile = tmp_path / "rank2.toml"
    profile.write_text(one_flip(2))
    out = tmp_path / "lock"
    assert (
        main(
            [
                "replay",
                "--golden",
                str(golden),
                "--fault-profile",
                str(profile),
                "--steps",
                "1",
                "--mode",
                "lockstep",
                "--out",
                str(out),
                "--quiet",
                "--rank-timeout",
                "120",
            ]
        )
        == 0
    )
    worst = [max(e.fields["frequency"] for e in rank_events(out, r, "site_mismatch")) for r in range(4)]
    assert worst[2] > 0 and worst[0] == worst[1] == worst[3] == 0.0
