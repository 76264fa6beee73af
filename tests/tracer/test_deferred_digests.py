"""On accelerators the Tracer reads no digest mid-step: a step's digests stay on the device and are read in
one transfer at the step's end. The same code runs here on CPU tensors (by declaring the CPU deferred), and
its log must equal the one recorded the ordinary way, record for record."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import small_config
from tracer import record_buffer
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, TensorRecord
from tracer.options import CapturePolicy, RunInfo, TraceOptions
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build


def _record(out: Path, steps: int = 3) -> list:
    cfg = small_config()
    w = build(cfg)
    options = TraceOptions(capture=CapturePolicy(steps=frozenset({1})))
    with Tracer(w.model, w.optimizer, out=out, run=RunInfo("n", config=cfg.to_dict()), options=options) as tr:
        for step in range(steps):
            with tr.step(step):
                run_step(w, step, tr)
    return [
        r if not isinstance(r, EventRecord) or r.kind != "step" else (r.kind, r.fields["loss"])
        for r in LogReader(rank_dir(out, 0)).records()
        if isinstance(r, (TensorRecord, EventRecord))
    ]


def test_deferred_digests_log_what_immediate_ones_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    immediate = _record(tmp_path / "immediate")
    monkeypatch.setattr(record_buffer, "deferred", lambda device: True)
    deferred = _record(tmp_path / "deferred")
    assert len(deferred) == len(immediate) and any(isinstance(r, TensorRecord) for r in deferred)
    for a, b in zip(immediate, deferred):
        if isinstance(a, TensorRecord):
            assert (a.step, a.microbatch, a.name, a.phase, a.fingerprint, a.meta, a.nan, a.inf) == (
                b.step,
                b.microbatch,
                b.name,
                b.phase,
                b.fingerprint,
                b.meta,
                b.nan,
                b.inf,
            )
            assert b.l2 == pytest.approx(a.l2, rel=1e-6)
        else:
            assert a == b
    blobs = sorted(p.name for p in (tmp_path / "deferred").rglob("*") if p.is_file() and "blob" in str(p))
    assert blobs == sorted(p.name for p in (tmp_path / "immediate").rglob("*") if p.is_file() and "blob" in str(p))
    assert blobs, "capture of step 1 wrote no blobs: the test would not check captured copies"
