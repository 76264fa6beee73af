"""`sdc diff` end to end on small real runs: Beam on its default runner, Parquet, DuckDB."""

from __future__ import annotations

import dataclasses
import shutil
import socket
from pathlib import Path

import duckdb
import pytest

from pipelines.run import run as run_module
from sdc.cli import main
from tests.pipelines.conftest import FAULT_MICROBATCH, FAULT_SITE, FAULT_STEP, GRAD_NOISE, SITE_MISMATCH, flipped_copy
from tracer.errors import LogCorruptionError, UsageError, ValidationError
from tracer.log import EventRecord, LogReader, LogWriter, Phase, TensorRecord, rank_dir

pytestmark = pytest.mark.slow  # every test runs a Beam job on runs recorded by a session fixture


def query(db: Path, sql: str, *params: object) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def test_healthy_pair_of_different_lengths(runs, run_diff, tmp_path: Path) -> None:
    report, lines = run_diff(runs["golden"], runs["twin"])
    db, pid = tmp_path / "study.duckdb", report.pair_id
    assert query(db, "SELECT golden_last_step, suspect_last_step, compared_through FROM pair_ranks") == [(4, 3, 3)]
    ((events, differing, last),) = query(db, "SELECT count(*), count(*) FILTER (NOT equal), max(step) FROM event_diffs")
    assert events > 0 and differing == 0 and last == 3  # the shorter run bounds the comparison
    assert query(db, "SELECT count(*) FROM first_divergence") == [(0,)]
    assert query(db, "SELECT DISTINCT step FROM divergence_steps WHERE differing = 0 ORDER BY step") == [
        (0,),
        (1,),
        (2,),
        (3,),
    ]
    drift = query(db, 'SELECT step, "group", drift FROM param_drift ORDER BY step, "group"')
    assert {step for step, _, _ in drift} == {0, 2, 4} and all(d == 0.0 for _, _, d in drift)
    assert {g for _, g, _ in drift} == {"*", "layers.0", "layers.1", "tok_embeddings", "norm", "output"}
    loss = query(db, "SELECT step, golden_loss, suspect_loss, diff FROM loss ORDER BY step")
    assert [s for s, *_ in loss] == [0, 1, 2, 3, 4] and loss[-1][2] is None
    assert all(d == 0.0 for *_, d in loss[:-1])
    assert query(db, "SELECT detector, tp, fp, fn, tn = units FROM detection_scores") == [
        ("fingerprint", 0, 0, 0, True)
    ]
    assert query(db, "SELECT role, complete, torn_tail FROM runs ORDER BY node_label") == [
        ("train", True, False),
        ("train", True, False),
    ]
    assert report.rows["event_diffs"] == events and report.counters["events_differing"] == 0
    assert lines[0] == "reading run headers ..." and any(line.startswith("[3/3] loading") for line in lines)
    assert query(db, "SELECT count(*) FROM pairs WHERE pair_id = ?", pid) == [(1,)]


def test_faulted_pair_first_divergence_is_the_injected_step_and_site(runs, run_diff, tmp_path: Path) -> None:
    beam = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    run_diff(runs["golden"], runs["hooked"], beam=beam)
    db = tmp_path / "study.duckdb"
    assert query(db, "SELECT step, microbatch, phase, name, status FROM first_divergence") == [
        (FAULT_STEP, FAULT_MICROBATCH, "forward", FAULT_SITE, "differ")
    ]
    frontier = dict(query(db, "SELECT step, differing FROM divergence_steps"))
    assert frontier[0] == frontier[1] == 0 and all(frontier[s] > 0 for s in (2, 3, 4))
    ((first_name, first_phase),) = query(
        db, "SELECT first_name, first_phase FROM divergence_steps WHERE step = ?", FAULT_STEP
    )
    assert (first_name, first_phase) == (FAULT_SITE, "forward")
    drift = dict(query(db, "SELECT step, drift FROM param_drift WHERE \"group\" = '*'"))
    assert drift[0] == drift[2] == 0.0 and drift[4] > 0  # a checkpoint holds the state before its step
    assert query(db, "SELECT count(*) FROM loss WHERE step < ? AND diff <> 0", FAULT_STEP) == [(0,)]
    ((fp, units),) = query(db, "SELECT fp, units FROM detection_scores WHERE detector = 'fingerprint'")
    assert 0 < fp < units  # no fault event was logged: every difference is unexplained


def test_emulated_faults_are_scored_against_fingerprints_and_abft(emulated, run_diff, tmp_path: Path) -> None:
    run_diff(emulated["golden"], emulated["suspect"])
    db = tmp_path / "study.duckdb"
    faults = query(db, "SELECT side, step, site, phase, traced_site, fingerprint_detected, abft_flagged FROM faults")
    assert faults and all(f[:4] == ("suspect", 3, "layers.1.feed_forward", "forward") for f in faults)
    assert all(f[4] == "layers.1.feed_forward" and f[5] is True for f in faults)
    assert query(db, "SELECT step, phase, name FROM first_divergence") == [(3, "forward", "layers.1.feed_forward")]
    scores = {
        (d, s): (tp, fp, fn)
        for d, s, tp, fp, fn in query(db, "SELECT detector, side, tp, fp, fn FROM detection_scores")
    }
    assert scores["fingerprint", "pair"][0] >= 1 and scores["fingerprint", "pair"][1] == 0
    assert scores["abft", "golden"] == (0, 0, 0)
    flagged = query(db, "SELECT count(*) FROM abft WHERE side = 'suspect' AND verdict = 'flag'")[0][0]
    assert (
        scores["abft", "suspect"][0]
        == query(db, "SELECT count(DISTINCT (step, microbatch, site, phase, op)) FROM abft WHERE outcome = 'tp'")[0][0]
    )
    assert flagged == query(db, "SELECT count(*) FROM abft WHERE verdict = 'flag' AND outcome IN ('tp', 'fp')")[0][0]


def test_replay_logs_fill_the_rq1_and_rq2_tables(runs, run_diff, tmp_path: Path) -> None:
    run_diff(runs["golden"], runs["twin"], replays=(str(runs["replay"]),))
    db = tmp_path / "study.duckdb"
    assert (
        query(
            db,
            "SELECT step, microbatch, site, phase, elements, mismatched, severity FROM site_mismatch "
            "ORDER BY step, site",
        )
        == SITE_MISMATCH
    )
    assert query(db, "SELECT step, name, diff_l2, golden_l2 FROM grad_noise ORDER BY step, name") == sorted(GRAD_NOISE)
    assert query(db, "SELECT DISTINCT replay_run_id FROM grad_noise") == [("replay-0001",)]
    assert query(db, "SELECT replay_run_ids FROM pairs") == [(["replay-0001"],)]
    assert query(db, "SELECT role FROM runs WHERE run_id = 'replay-0001'") == [("replay",)]


def test_loading_again_replaces_the_pair_and_pairs_share_a_database(runs, run_diff, tmp_path: Path) -> None:
    first, _ = run_diff(runs["golden"], runs["twin"])
    again, _ = run_diff(runs["golden"], runs["twin"])
    other, _ = run_diff(runs["golden"], runs["hooked"])
    db = tmp_path / "study.duckdb"
    assert first.pair_id == again.pair_id != other.pair_id and first.rows == again.rows
    counts = dict(query(db, "SELECT pair_id, count(*) FROM event_diffs GROUP BY pair_id"))
    assert counts == {first.pair_id: first.rows["event_diffs"], other.pair_id: other.rows["event_diffs"]}
    assert query(db, "SELECT count(*) FROM runs") == [(3,)]


def test_mismatched_pair_fails_listing_every_differing_field(runs, run_diff, tmp_path: Path) -> None:
    header = LogReader(rank_dir(runs["twin"], 0)).header
    other = tmp_path / "other"
    changed = dataclasses.replace(
        header,
        run_id="other",
        seed=1,
        config_fingerprint="cfg-x",
        fingerprint_algorithm="other-v2",
        determinism={"intra_op_threads": 7},
    )
    LogWriter(rank_dir(other, 0), changed).close()
    with pytest.raises(ValidationError) as err:
        run_diff(runs["golden"], other)
    message = str(err.value)
    for field in ("config_fingerprint", "seed", "fingerprint_algorithm", "determinism.intra_op_threads"):
        assert f"{field}:" in message
    assert "data_order_fingerprint" not in message and not (tmp_path / "study.duckdb").exists()


def test_corrupt_segment_is_reported_with_file_and_offset(runs, run_diff, tmp_path: Path) -> None:
    suspect = tmp_path / "corrupt"
    flipped_copy(runs["twin"], suspect)
    expected = LogReader(rank_dir(suspect, 0), on_corruption="skip")
    list(expected.records())
    ((path, offset, reason),) = expected.status.corruptions
    with pytest.raises(LogCorruptionError) as err:
        run_diff(runs["golden"], suspect)
    assert (err.value.path, err.value.offset, err.value.reason) == (path, offset, reason)
    report, lines = run_diff(runs["golden"], suspect, skip_corrupt=True)
    db = tmp_path / "study.duckdb"
    assert query(db, 'SELECT side, path, "offset", reason FROM corruptions') == [("suspect", path, offset, reason)]
    assert any(f"at byte {offset}" in line for line in lines) and report.rows["event_diffs"] > 0


def test_crashed_run_and_kept_staging(runs, run_diff, tmp_path: Path) -> None:
    suspect = tmp_path / "crashed"
    shutil.copytree(runs["twin"], suspect)
    seg = rank_dir(suspect, 0) / "000000.sdclog"
    seg.write_bytes(seg.read_bytes()[:-30])  # the END record and part of the last record: a crash mid-write
    staging = tmp_path / "staging"
    report, _ = run_diff(runs["golden"], suspect, staging=str(staging))
    db = tmp_path / "study.duckdb"
    assert query(db, "SELECT complete, torn_tail FROM runs WHERE node_label = 'twin'") == [(False, True)]
    assert query(db, "SELECT count(*) FROM corruptions") == [(0,)] and report.rows["event_diffs"] > 0
    assert sorted(p.name for p in staging.iterdir()) == sorted(t for t, n in report.rows.items() if n)
    with pytest.raises(UsageError, match="not empty"):
        run_diff(runs["golden"], suspect, staging=str(staging))


def test_cli_runs_the_diff_and_errors_in_one_line(runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "cli.duckdb"
    base = ["diff", "--golden", str(runs["golden"]), "--db", str(db)]
    assert main([*base, "--suspect", str(runs["hooked"]), "--", "--direct_running_mode=in_memory"]) == 0
    out = capsys.readouterr().out
    assert "[2/3] Beam job on FnApiRunner (in_memory)" in out
    assert f"first divergence: rank 0, step {FAULT_STEP}, microbatch {FAULT_MICROBATCH}, forward {FAULT_SITE}" in out
    assert main([*base, "--suspect", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdc: error: ") and "holds no log segments" in err[0]
    # python -m pipelines.run: the same job, Beam's options mixed in with its own
    assert run_module([*base[1:], "--suspect", str(runs["twin"]), "--direct_running_mode=in_memory"]) == 0
    assert "result: " in capsys.readouterr().out


def test_the_default_job_looks_up_no_host(runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam's DirectRunner first tries to download the Prism runner from GitHub; the default runner never reaches
    out (a cluster without internet access would wait on it, or run the diff on a runner nothing tested)."""
    looked_up: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: object, **kwargs: object) -> object:
        looked_up.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    db = tmp_path / "offline.duckdb"
    assert main(["diff", "--golden", str(runs["golden"]), "--suspect", str(runs["twin"]), "--db", str(db)]) == 0
    assert [h for h in looked_up if h not in ("localhost", "127.0.0.1", "::1")] == []


def write_two_ranks(out: Path, header, steps: dict[int, int], changed: tuple[int, int] | None = None) -> None:
    """A 2-rank run of `steps[rank]` steps; `changed`: (rank, step) from which rank's site outputs differ."""
    for rank, n in steps.items():
        parallel = {"dp": 2, "tp": 1, "sp": False, "coords": {"dp": rank, "tp": 0}}  # two data-parallel replicas
        h = dataclasses.replace(
            header, run_id=f"{out.name}-{rank}", rank=rank, world_size=2, extra={**header.extra, "parallel": parallel}
        )
        with LogWriter(rank_dir(out, rank), h, segment_bytes=2_000) as w:
            for step in range(n):
                for mb in range(2):
                    for site in ("layers.0.attention", "layers.1.attention"):
                        differ = changed is not None and rank == changed[0] and step >= changed[1]
                        w.write_tensor(
                            TensorRecord(
                                step,
                                mb,
                                site,
                                Phase.FORWARD,
                                1000 * step + mb + int(differ),
                                1.0,
                                1.0,
                                0,
                                0,
                                "float32[4]",
                            )
                        )
                w.write_event(EventRecord("step", step, {"loss": 2.0, "lr": [1e-3], "wall_s": 0.1, "microbatches": 2}))


def test_ranks_are_compared_and_bounded_one_by_one(runs, run_diff, tmp_path: Path) -> None:
    header = LogReader(rank_dir(runs["golden"], 0)).header
    write_two_ranks(tmp_path / "g2", header, {0: 6, 1: 6})
    write_two_ranks(tmp_path / "s2", header, {0: 6, 1: 4}, changed=(1, 2))
    report, _ = run_diff(tmp_path / "g2", tmp_path / "s2", steps_per_bucket=2)
    db = tmp_path / "study.duckdb"
    assert query(db, "SELECT rank, compared_through FROM pair_ranks ORDER BY rank") == [(0, 5), (1, 3)]
    assert query(db, "SELECT rank, step, microbatch, name FROM first_divergence") == [(1, 2, 0, "layers.0.attention")]
    assert query(db, "SELECT rank, count(*) FROM event_diffs GROUP BY rank ORDER BY rank") == [(0, 24), (1, 16)]
    assert query(db, "SELECT count(*), sum(segments) > 2 FROM runs") == [(4, True)]
    assert report.counters["segments_read"] > 4
