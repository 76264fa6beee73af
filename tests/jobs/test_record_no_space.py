"""A first recording that runs out of space stays resumable (issue 48, item 5): under a file-size limit
(RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG, as on a full disk) that the checkpoint of step 2 does not
fit, it fails in one line that says where it failed and where a resume starts, leaves no END, and a resume with
room gives, fingerprint for fingerprint, the records of an uninterrupted run. A folder a kill during start-up left
(sdctrace's claim and checkpoint 0, no log) is recorded again from step 0, by `--resume` or by a plain `sdc record`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.record import record_run
from sdc.cli import main
from tests.support import SMALL, small_config
from tests.watch.test_record_resume import timeline
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.sessions import NO_SPACE

# Once the checkpoint of step 0 is written, no file may grow as large as it: the checkpoint of step 2 cannot be.
NO_ROOM_AT_CHECKPOINT_2 = """
import resource, signal, sys
from pathlib import Path
from tests.support import small_config
from jobs.record import record_run
from sdc.cli import main
from tracer.errors import SdcError
out = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
def no_room(step, loss):
    if step == 0:
        size = (out / "checkpoints" / "step-000000" / "rank-00000.safetensors").stat().st_size
        resource.setrlimit(resource.RLIMIT_FSIZE, (size - 1, resource.RLIM_INFINITY))
try:
    record_run(small_config(), out, node_label="node", progress=False, on_step=no_room)
except SdcError as e:
    print(e)
    sys.exit(1)
"""


@pytest.fixture(scope="module")
def once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted recording."""
    out = tmp_path_factory.mktemp("no-space") / "once"
    record_run(small_config(), out, node_label="node", progress=False)
    return out


def test_a_first_recording_that_failed_at_checkpoint_2_resumes_from_checkpoint_0(
    once: Path, tmp_path: Path, capsys
) -> None:
    twice = tmp_path / "twice"
    full = subprocess.run(
        [sys.executable, "-c", NO_ROOM_AT_CHECKPOINT_2, str(twice)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
    )
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr[-2000:]
    [line] = full.stdout.splitlines()
    assert "failed at step 2 (File too large); resumable from checkpoint 0" in line and "--resume" in line
    reader = LogReader(rank_dir(twice, 0), on_corruption="skip")
    assert [r.kind for r in reader.records() if getattr(r, "kind", None) == NO_SPACE] == [NO_SPACE]
    assert not reader.status.complete  # no END: what the first session recorded is kept for the resume
    assert main(["inspect", str(twice)]) == 0
    assert "state        FAILED at step 2 for lack of space; resumable from checkpoint 0" in capsys.readouterr().out

    summary = record_run(small_config(), twice, node_label="node", progress=False, resume=True)
    assert summary.resumed_from == 0
    assert [r for r in timeline(twice) if not (isinstance(r, tuple) and r[0] == NO_SPACE)] == timeline(once)
    comparison = compare_runs(once, twice)
    assert comparison.first is None and comparison.steps == 4
    reader = LogReader(rank_dir(twice, 0))
    assert len(list(reader.records())) > 0 and reader.status.complete


@pytest.mark.parametrize("how", ["--resume", "a plain sdc record"])
def test_a_folder_a_start_up_kill_left_is_resumed_from_step_0(once: Path, tmp_path: Path, how: str, capsys) -> None:
    left = tmp_path / "left"
    shutil.copytree(once, left)
    for segment in (left / "rank-00000").iterdir():  # killed before its header went out: the claim, checkpoints
        segment.unlink()
    if how == "--resume":
        summary = record_run(small_config(), left, node_label="node", progress=False, resume=True)
        assert summary.resumed_from is None and len(summary.losses) == 4
    else:  # the folder holds sdctrace's claim: recorded again, no --overwrite asked for
        settings = [a for kv in SMALL for a in ("--set", kv)]
        assert main(["record", "--out", str(left), "--node-label", "node", "--quiet", *settings]) == 0
        assert "recorded 4 steps" in capsys.readouterr().out
    assert timeline(left) == timeline(once) and compare_runs(once, left).first is None
