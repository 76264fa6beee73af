"""Checkpoints resume training bit for bit; damaged ones and blobs are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracer.blobs import BlobStore
from tracer.checkpoint import checkpoint_dir, list_checkpoints, load_checkpoint
from tracer.errors import LogError
from tracer.fingerprint import fingerprint
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
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
