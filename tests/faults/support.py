"""Shared by the fault emulator and ABFT tests: the shipped profile names, events of a run, a small traced MLP
trained under the emulator and the first record in which two such runs differ."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from faults import FaultProfile
from faults.node import emulated_node
from tests.support import events
from tracer.determinism import configure_determinism
from tracer.intercept import paused
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, TensorRecord
from tracer.options import CapturePolicy, RunInfo, TraceOptions
from tracer.tracing import Tracer

__all__ = ["SHIPPED", "events"]

SHIPPED = {"healthy-node", "bursty-mismatch", "rare-huge", "loss-spike", "softmax-norm"}


def small_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


def train_mlp(
    out: Path,
    profile: FaultProfile | None,
    *,
    steps: int,
    foreach: bool = False,
    fault_seed: int = 0,
    model_of: Callable[[], nn.Module] = small_mlp,
    sites: str = "0|2",
    capture: CapturePolicy = CapturePolicy(),
) -> dict:
    """``steps`` steps of a small MLP (or ``model_of()``, 8 features in and out) with AdamW, traced at ``sites``,
    under the emulator if ``profile``: whether each optimizer step ran with the interceptors paused, the fault
    events, every tensor record (log order), the parameters at the end and by name after each step."""
    configure_determinism(seed=0, threads=1)
    model = model_of()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    steps_paused: list[bool] = []
    optimizer.register_step_pre_hook(lambda *_: steps_paused.append(paused()))  # after the global hooks
    after: list[dict[str, torch.Tensor]] = []
    data = torch.Generator().manual_seed(1)
    with Tracer(
        model, optimizer, out=out, run=RunInfo("node"), options=TraceOptions(sites=sites, capture=capture), echo=None
    ) as tracer:
        with emulated_node(tracer, model, fault_profile=profile, fault_seed=fault_seed):
            for step in range(steps):
                with tracer.step(step):
                    x = torch.randn(4, 8, generator=data)
                    tracer.microbatch(0, inputs=x)
                    loss = (model(x) - x.flip(-1)).pow(2).mean()
                    loss.backward()
                    tracer.loss(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                after.append({n: p.detach().clone() for n, p in model.named_parameters()})
    records = list(LogReader(rank_dir(out, 0)).records())
    return {
        "paused": steps_paused,
        "faults": [(r.step, r.fields) for r in records if isinstance(r, EventRecord) and r.kind == "fault"],
        "tensors": [r for r in records if isinstance(r, TensorRecord)],
        "params": [p.detach().clone() for p in model.parameters()],
        "after": after,
    }


def first_divergence(clean: list[TensorRecord], faulty: list[TensorRecord]) -> TensorRecord:
    """The first record of ``faulty`` whose fingerprint differs from ``clean``'s (both record the same sequence)."""
    assert [(r.step, r.phase, r.name) for r in clean] == [(r.step, r.phase, r.name) for r in faulty]
    return next(f for c, f in zip(clean, faulty) if c.fingerprint != f.fingerprint)
