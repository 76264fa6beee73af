"""Small, real workload settings shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracer.log import LogReader, LogWriter, rank_dir
from tracer.log.records import EventRecord, Phase, TensorRecord
from workload.multiple_choice import FinetuneSettings
from workload.reference_config import Config, load_config

if TYPE_CHECKING:
    import numpy as np
    import pytest

# A 2-layer model with short sequences and a handful of steps on one intra-op thread: real, but quick. A second
# thread buys this model no time (a step's ops are too small to split) and takes the core that another test
# process (`make test` runs two) needs.
SMALL = [
    "model.n_layers=2",
    "data.batch_size=2",
    "data.seq_len=32",
    "run.steps=4",
    "run.checkpoint_every=2",
    "train.threads=1",
]


def small_config(*overrides: str) -> Config:
    return load_config(None, [*SMALL, *overrides])


def events(run: Path, kind: str) -> list[EventRecord]:
    """Rank 0's events of one kind, in log order."""
    return [r for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, EventRecord) and r.kind == kind]


def rewrite_header(run: Path, *, drop: str | None = None, **changes: Any) -> None:
    """Write rank 0's log again, record for record, under a header with ``changes`` (a crafted run); without the
    events of kind ``drop`` (e.g. ``rng``: a log as an sdctrace before them wrote it)."""
    reader = LogReader(rank_dir(run, 0))
    header = dataclasses.replace(reader.header, **changes)
    records = [r for r in reader.records() if not (isinstance(r, EventRecord) and r.kind == drop)]
    shutil.rmtree(rank_dir(run, 0))
    with LogWriter(rank_dir(run, 0), header) as w:
        for r in records:
            w.write_tensor(r) if isinstance(r, TensorRecord) else w.write_event(r)


# A process that claims a run directory and holds it until its stdin closes: another writer, for lock tests.
_HOLDER = """
import sys
from pathlib import Path
from tracer.log import claim_out_dir
with claim_out_dir(Path(sys.argv[1]), role="train", overwrite=False):
    print("claimed", flush=True)
    sys.stdin.read()
"""


def hold_run_dir(out: Path) -> subprocess.Popen[str]:
    """Start a process that holds ``out``'s writer lock; returns once it holds it (close its stdin to end it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "claimed\n"
    return holder


# A fault profile that flips one exponent bit in each forward matmul of one site at one step.
ONE_FLIP = """
description = "one exponent flip in layers.1.feed_forward's forward matmuls at step 3"
seed = 7
[[fault]]
ops = ["matmul"]
sites = "layers\\\\.1\\\\.feed_forward"
phases = ["forward"]
steps = [3]
p_call = 1.0
elements = 1
kind = "bitflip"
bits = "exponent"
"""

# A fine-tune of a few steps on a few examples of two tasks: real, but quick.
TINY_FINETUNE = FinetuneSettings(
    steps=4, batch_size=8, eval_every=2, checkpoint_every=2, train_per_task=16, test_per_task=8, tasks=("copy", "add")
)

# Scales a few elements of each forward matmul of layers.0.feed_forward by 8 at (fine-tune) step 1: several,
# and before the last layer, so that they reach the answer position of some prompt and change training.
SCALE_AT_1 = """
description = "a few elements of layers.0.feed_forward's forward matmuls scaled by 8 at step 1"
seed = 7
[[fault]]
ops = ["matmul"]
sites = "layers\\\\.0\\\\.feed_forward"
phases = ["forward"]
steps = [1]
elements = 16
kind = "scale"
factor = 8.0
"""


def diff_first_divergence(golden: Path, suspect: Path, db: Path) -> list[tuple]:
    """`sdc diff` the pair (in process, Beam in memory), then the first_divergence rows:
    (step, microbatch, phase, name, status)."""
    import duckdb

    from sdc.cli import main

    assert (
        main(
            [
                "diff",
                "--golden",
                str(golden),
                "--suspect",
                str(suspect),
                "--db",
                str(db),
                "--",
                "--direct_running_mode=in_memory",
            ]
        )
        == 0
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT step, microbatch, phase, name, status FROM first_divergence").fetchall()
    finally:
        con.close()


def reframe(path: Path, offset: int, payload: bytes) -> None:
    """Replace the payload of the record at `offset` in a segment file, framed the way the spec says (length, CRC of
    type byte + payload): the record passes its CRC and reaches the content check. The records after it move."""
    import struct
    import zlib

    data = path.read_bytes()
    length, _crc, rtype = struct.unpack_from("<IIB", data, offset)
    frame = struct.pack("<IIB", len(payload), zlib.crc32(bytes([rtype]) + payload), rtype) + payload
    path.write_bytes(data[:offset] + frame + data[offset + 9 + length :])


def captured_gradients(run: Path, step: int) -> dict[str, np.ndarray]:
    """The full parameter gradients a run captured (CapturePolicy) at ``step``, by name, in float64."""
    from tracer.blobs import BlobStore

    store = BlobStore(run)
    return {
        e.fields["name"]: store.get(e.fields["fingerprint"]).double().numpy()
        for e in events(run, "blob")
        if e.step == step and e.fields["phase"] == int(Phase.GRAD)
    }


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A folder that ``make`` fills once per test run, whichever xdist worker asks first: the others wait on its lock
    and read the same folder (a session fixture is otherwise made again in every worker; `make test` runs two).
    For fixtures whose tests only read what was made. A ``make`` that failed is tried again by the next asker."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "made-once" / name
    folder.parent.mkdir(exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder
