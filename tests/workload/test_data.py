"""The embedded corpus and the deterministic, seeded data order."""

from __future__ import annotations

import dataclasses
import hashlib
from importlib import resources

import pytest
import torch

from workload.data import TokenData, load_corpus
from workload.reference_config import DataConfig


def test_corpus_is_embedded_licensed_and_large_enough():
    corpus = load_corpus()
    assert len(corpus) >= 1_000_000
    corpus.decode("utf-8")  # text, not noise
    notice = (resources.files("workload") / "corpus" / "LICENSE").read_text()
    assert "LICENSE AGREEMENT is between the Python Software Foundation" in notice
    assert hashlib.sha256(corpus).hexdigest() in notice  # the notice describes these bytes


def test_batch_is_a_pure_function_of_step_and_microbatch():
    cfg = DataConfig(seq_len=32, batch_size=4, microbatches=2)
    a, b = TokenData(cfg), TokenData(cfg)
    late = a.batch(7, 1)  # out of order: no hidden iterator state
    for step, mb in [(0, 0), (0, 1), (7, 1)]:
        (xa, ya), (xb, yb) = a.batch(step, mb), b.batch(step, mb)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(late[0], b.batch(7, 1)[0])
    assert not torch.equal(a.batch(0, 0)[0], a.batch(0, 1)[0])


def test_targets_are_inputs_shifted_by_one():
    cfg = DataConfig(seq_len=16, batch_size=3, microbatches=1)
    corpus = load_corpus()
    data = TokenData(cfg, corpus)
    inputs, targets = data.batch(3, 0)
    assert inputs.shape == targets.shape == (3, 16)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    windows = {corpus[k * 16 : k * 16 + 17] for k in range(data.num_windows)}
    for x, y in zip(inputs, targets):
        assert bytes(x.tolist()) + bytes([int(y[-1])]) in windows


def test_epochs_wrap_and_each_visits_every_window_once():
    seq_len, num_windows = 10, 12
    # Byte i of this corpus is i, so a window's first token is its offset: window * seq_len.
    corpus = bytes(range(num_windows * seq_len + 1))
    cfg = DataConfig(seq_len=seq_len, batch_size=2, microbatches=2)
    data = TokenData(cfg, corpus)
    assert data.num_windows == num_windows
    steps_per_epoch = num_windows // (cfg.batch_size * cfg.microbatches)

    def windows(epoch: int) -> list[int]:
        return [
            int(row[0]) // seq_len
            for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
            for mb in range(cfg.microbatches)
            for row in data.batch(step, mb)[0]
        ]

    orders = [windows(epoch) for epoch in range(3)]
    for order in orders:
        assert sorted(order) == list(range(num_windows))
    assert orders[0] != orders[1] and orders[1] != orders[2]


def test_shuffle_seed_changes_order_and_fingerprint():
    cfg = DataConfig(seq_len=32, batch_size=4, microbatches=2)
    twin = dataclasses.replace(cfg, shuffle_seed=1)
    a, b = TokenData(cfg), TokenData(twin)
    assert a.fingerprint == TokenData(cfg).fingerprint
    assert a.fingerprint != b.fingerprint
    assert not torch.equal(a.batch(0, 0)[0], b.batch(0, 0)[0])
    for change in (dict(seq_len=16), dict(batch_size=2), dict(microbatches=1)):
        assert TokenData(dataclasses.replace(cfg, **change)).fingerprint != a.fingerprint
    assert TokenData(cfg, b"x" * 1000).fingerprint != a.fingerprint  # a different corpus


def test_bad_microbatch_is_refused():
    data = TokenData(DataConfig(microbatches=2))
    with pytest.raises(ValueError, match="got step=0, microbatch=2"):
        data.batch(0, 2)
