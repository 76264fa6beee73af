"""Checkpoints resume training bit for bit; damaged ones and blobs are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tracer.blobs import BlobStore
from tracer.checkpoint import checkpoint_dir, list_checkpoints, load_checkpoint, save_checkpoint
from tracer.errors import LogError
from tracer.fingerprint import fingerprint
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.summary import summarize_run
from workload.protocol import run_step
from workload.reference import build


def test_resuming_from_a_checkpoint_reproduces_the_log(run_factory, small_cfg) -> None:
    run = run_factory("golden")
    assert list_checkpoints(run) == [0, 2, 4]
    w = build(small_cfg)
    ckpt = load_checkpoint(run, 2)
    assert ckpt.step == 2 and ckpt.data == {"step": 2}
    ckpt.restore(w.model, w.optimizer)
    for step in (2, 3):
        run_step(w, step)
    logged = {
        r.name: r.fingerprint
        for r in LogReader(rank_dir(run, 0)).records()
        if isinstance(r, TensorRecord) and r.phase == Phase.PARAM and r.step == 3
    }
    assert logged == {n: fingerprint(p) for n, p in w.model.named_parameters()}
    final = load_checkpoint(run, 4)
    for name, p in w.model.state_dict().items():
        assert torch.equal(p, final.model[name]), name
    opt_final = final.optimizer["state"]
    for pid, state in w.optimizer.state_dict()["state"].items():
        for key, val in state.items():
            assert torch.equal(val, opt_final[pid][key]), (pid, key)


def test_a_damaged_checkpoint_is_refused(run_factory) -> None:
    run = run_factory("golden")
    st = checkpoint_dir(run, 2) / "rank-00000.safetensors"
    data = bytearray(st.read_bytes())
    data[-5] ^= 0x40  # a bit flip in the last tensor's bytes
    st.write_bytes(bytes(data))
    with pytest.raises(LogError, match="does not match its recorded fingerprint"):
        load_checkpoint(run, 2)
    with pytest.raises(LogError, match=r"no complete checkpoint for step 3.*\[0, 2, 4\]"):
        load_checkpoint(run, 3)


def test_blob_store_round_trip_and_integrity(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    t = torch.randn(4, 5).to(torch.bfloat16)
    fp = fingerprint(t)
    path = store.put(fp, t)
    assert path == store.path(fp) and fp in store
    assert store.put(fp, t) == path  # stored once
    assert torch.equal(store.get(fp), t)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(LogError, match="does not match its fingerprint"):
        store.get(fp)
    with pytest.raises(LogError, match="is missing"):
        store.get(fp ^ 1)


def test_any_state_dict_is_kept_without_pickle_and_restored(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    for _ in range(3):
        opt.step()
        sched.step()

    class Cursor:  # a data cursor with a tensor in its state
        def __init__(self) -> None:
            self.position, self.order = 0, torch.arange(3)

        def state_dict(self) -> dict:
            return {"position": self.position, "order": self.order, "nested": [{"k": 1.5}]}

        def load_state_dict(self, state: dict) -> None:
            self.position, self.order = state["position"], state["order"]

    cursor = Cursor()
    cursor.position, cursor.order = 7, torch.tensor([2, 0, 1])
    save_checkpoint(tmp_path, 3, 0, model, opt, {"step": 3}, states={"scheduler": sched, "cursor": cursor})

    fresh_opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    fresh_sched = torch.optim.lr_scheduler.LambdaLR(fresh_opt, lambda step: 0.5**step)
    fresh_cursor = Cursor()
    load_checkpoint(tmp_path, 3).restore(model, fresh_opt, {"scheduler": fresh_sched, "cursor": fresh_cursor})
    assert fresh_sched.last_epoch == 3 and fresh_sched.get_last_lr() == sched.get_last_lr()
    assert fresh_cursor.position == 7 and torch.equal(fresh_cursor.order, torch.tensor([2, 0, 1]))
    with pytest.raises(LogError, match="holds no state for 'sampler'"):
        load_checkpoint(tmp_path, 3).restore(model, fresh_opt, {"sampler": fresh_cursor})


def test_a_state_that_needs_pickle_is_refused_naming_it(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)

    class Odd:
        def state_dict(self) -> dict:
            return {"fn": object()}

        def load_state_dict(self, state: dict) -> None: ...

    with pytest.raises(LogError, match=r"'state/odd/fn': cannot store a object without pickle"):
        save_checkpoint(tmp_path, 0, 0, model, None, {}, states={"odd": Odd()})


_FULL_DISK = """
import resource, signal, sys
from sdc.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))  # log segments fit; a checkpoint does not
sys.exit(main(["record", "--out", sys.argv[1], "--node-label", "full", "--steps", "3",
               "--set", "run.checkpoint_every=2", "--quiet"]))
"""


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_is_one_line_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("sdc: error: ") and "cannot write the checkpoint of step 0" in done.stderr
    assert list_checkpoints(out) == [] and not (out / "checkpoints" / "step-000000").exists()
    (summary,) = summarize_run(out)  # a lack of space leaves the log open for a resume (its no_space event), no END
    assert summary.status.end is None and summary.events["no_space"] == 1 and summary.out_of_space == 0
