"""`sdc watch` on logs written here: pairing, the first divergence, --keep-going, waiting, resumptions."""

from __future__ import annotations

import dataclasses
import io
import threading
import time
from pathlib import Path

from sdc.cli import main
from sdc.commands.watch import EXIT_DIVERGED, EXIT_IDENTICAL, EXIT_INCOMPLETE, Watch, WatchOptions
from tests.watch.support import HEADER, steps_records, uninterrupted, write_steps
from tracer.log import LogWriter, TensorRecord, rank_dir
from tracer.log.resume import log_end
from tracer.log.runlock import RunLock
from tracer.log.sessions import Resumption

FAST = WatchOptions(idle_timeout_s=5, progress_every_s=0, poll_s=0.005)


def flipped(steps: range, at: tuple[int, str]) -> list:
    """`steps` with one fingerprint changed: step `at[0]`'s backward record of `at[1]`."""
    out = []
    for r in steps_records(steps):
        if isinstance(r, TensorRecord) and (r.step, r.name, r.phase.name) == (at[0], at[1], "BACKWARD"):
            r = dataclasses.replace(r, fingerprint=r.fingerprint ^ 1 << 63, l2=float("inf"))
        out.append(r)
    return out


def write(run: Path, records: list, header=HEADER) -> Path:
    with LogWriter(rank_dir(run, 0), header) as w:
        for r in records:
            w.write_tensor(r) if isinstance(r, TensorRecord) else w.write_event(r)
    return run


def watch(golden: Path, suspect: Path, options: WatchOptions = FAST) -> tuple[int, str]:
    out = io.StringIO()
    return Watch(golden, suspect, options, out=out).run(), out.getvalue()


def test_identical_runs_exit_0(tmp_path: Path) -> None:
    golden, suspect = (uninterrupted(rank_dir(tmp_path / n, 0), 7).parent for n in ("g", "s"))
    status, out = watch(golden, suspect)
    assert status == EXIT_IDENTICAL and "identical (84 records compared)" in out


def test_the_first_divergence_names_the_record_and_both_stats(tmp_path: Path) -> None:
    golden = write(tmp_path / "g", steps_records(range(9)))
    suspect = write(tmp_path / "s", flipped(range(9), (4, "layers.1.feed_forward")))
    status, out = watch(golden, suspect)
    assert status == EXIT_DIVERGED
    assert "DIVERGENCE at step 4, rank 0, microbatch 0: layers.1.feed_forward backward" in out
    assert "l2 inf" in out and out.count("DIVERGENCE") == 1 and "diverged at step 4" in out
    lines = out.splitlines()  # real line breaks: the head, then each run's record on a line of its own
    head = next(i for i, line in enumerate(lines) if line.startswith("DIVERGENCE"))
    assert "\\n" not in out and lines[head].endswith("backward"), out
    assert [line.split()[0] for line in lines[head + 1 : head + 3]] == ["golden", "suspect"], out


def test_keep_going_reports_each_diverging_step_once(tmp_path: Path) -> None:
    golden = write(tmp_path / "g", steps_records(range(9)))
    bad = flipped(range(9), (4, "layers.1.feed_forward"))
    bad = [
        dataclasses.replace(r, fingerprint=r.fingerprint + 1) if isinstance(r, TensorRecord) and r.step == 6 else r
        for r in bad
    ]
    suspect = write(
        tmp_path / "s",
        [r for r in bad if not (isinstance(r, TensorRecord) and r.step == 7 and r.name == "layers.2.attention")],
    )
    status, out = watch(golden, suspect, dataclasses.replace(FAST, keep_going=True))
    assert status == EXIT_DIVERGED
    assert [line.split(",")[0] for line in out.splitlines() if line.startswith("DIVERGENCE")] == [
        "DIVERGENCE at step 4",
        "DIVERGENCE at step 6",
        "DIVERGENCE at step 7",
    ]
    assert "(no such record: only the other run holds it)" in out


def test_runs_that_do_not_pair_are_an_error(tmp_path: Path, capsys) -> None:
    golden = write(tmp_path / "g", steps_records(range(2)))
    suspect = write(tmp_path / "s", steps_records(range(2)), dataclasses.replace(HEADER, seed=2))
    assert main(["watch", "--golden", str(golden), "--suspect", str(suspect)]) == 1
    err = capsys.readouterr().err
    assert "do not pair" in err and "seed: 1 vs 2" in err


def test_a_crashed_writer_is_waited_for_and_its_resumption_compared_again(tmp_path: Path) -> None:
    golden = write(tmp_path / "g", steps_records(range(12)))
    suspect = tmp_path / "s"
    (suspect).mkdir()
    lock = RunLock.acquire(suspect)
    w = LogWriter(rank_dir(suspect, 0), HEADER)
    write_steps(w, range(8))
    w.abandon()
    lock.release()  # crashed after step 7
    out = io.StringIO()
    result: list[int] = []
    watcher = threading.Thread(target=lambda: result.append(Watch(golden, suspect, FAST, out=out).run()))
    watcher.start()
    deadline = time.monotonic() + 120  # a bound, not a timing: a fresh venv compiles what the watcher imports first
    while "(crashed)" not in out.getvalue() and time.monotonic() < deadline:  # the tmp_path says "crashed" too
        time.sleep(0.01)
    assert "suspect rank 0: the writer stopped without finishing (crashed) after step 7" in out.getvalue()

    with RunLock.acquire(suspect):  # `sdc record --resume`, from the checkpoint of step 5, on a node gone bad
        end = log_end(rank_dir(suspect, 0))
        resume = Resumption(end.segments, 5, end.records, end.last_step)
        with LogWriter(rank_dir(suspect, 0), HEADER, resume=resume) as w:
            for r in flipped(range(5, 12), (6, "layers.0.attention")):
                w.write_tensor(r) if isinstance(r, TensorRecord) else w.write_event(r)
    watcher.join(120)
    text = out.getvalue()
    assert result == [EXIT_DIVERGED], text
    assert "suspect rank 0: resumed from the checkpoint of step 5 (it had completed step 7)" in text
    # Step 6 was compared (identical) before the crash: only comparing the resumed records again finds this.
    assert "DIVERGENCE at step 6, rank 0, microbatch 0: layers.0.attention backward" in text


def test_a_run_that_never_comes_is_given_up_on(tmp_path: Path) -> None:
    golden = write(tmp_path / "g", steps_records(range(2)))
    status, out = watch(golden, tmp_path / "never", dataclasses.replace(FAST, idle_timeout_s=0.3))
    assert status == EXIT_INCOMPLETE and "suspect rank 0 waiting" in out


def test_a_writer_that_crashed_and_came_back_between_two_looks_is_still_said_to_have_crashed(tmp_path: Path) -> None:
    # Watch never sees the writer gone: it crashes and is resumed between two of watch's looks (as when a killed
    # writer is resumed at once on a loaded machine; here the lock is simply never let go). The resumption's record
    # says that the writer had crashed, and watch says so before it says the writer resumed.
    golden = write(tmp_path / "g", steps_records(range(12)))
    suspect = tmp_path / "s"
    suspect.mkdir()
    lock = RunLock.acquire(suspect)
    w = LogWriter(rank_dir(suspect, 0), HEADER)
    write_steps(w, range(8))
    w.flush()
    out = io.StringIO()
    result: list[int] = []
    watcher = threading.Thread(target=lambda: result.append(Watch(golden, suspect, FAST, out=out).run()))
    watcher.start()
    deadline = time.monotonic() + 120  # a bound, not a timing: a fresh venv compiles what the watcher imports first
    while "compared through step 7" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    w.abandon()
    end = log_end(rank_dir(suspect, 0))
    with LogWriter(rank_dir(suspect, 0), HEADER, resume=Resumption(end.segments, 5, end.records, 7)) as w:
        write_steps(w, range(5, 12))
    lock.release()
    watcher.join(120)
    text = out.getvalue()
    crashed = "suspect rank 0: the writer stopped without finishing (crashed) after step 7"
    resumed = "suspect rank 0: resumed from the checkpoint of step 5 (it had completed step 7)"
    assert result == [EXIT_IDENTICAL] and crashed in text and resumed in text, text
    assert text.index(crashed) < text.index(resumed) and text.count("(crashed)") == 1, text
