"""The `rng` events: the torch RNG at each step's start, stored where the loop drew from it between steps."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tests.support import events
from tracer.blobs import BlobStore
from tracer.options import RunInfo, TraceOptions
from tracer.rng import TorchRng, recorded_rng
from tracer.tracing import Tracer


def test_the_state_at_a_step_start_is_stored_only_where_the_loop_drew_between_steps(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    starts = {}
    with Tracer(model, opt, out=tmp_path / "run", run=RunInfo("a"), options=TraceOptions(sites=r"\d")) as tracer:
        tracer.checkpoint(0)
        for step in range(4):
            if step in (0, 2):
                torch.rand(1)  # a draw outside the step, as a data loader's iterator draws its base seed
            with tracer.step(step):
                starts[step] = TorchRng.now()
                tracer.microbatch(0)
                loss = model(torch.ones(4, 8)).sum()  # dropout draws inside the step
                loss.backward()
                tracer.loss(loss)
                opt.step()
                opt.zero_grad()
    rng = events(tmp_path / "run", "rng")
    assert [(e.step, e.fields["stored"]) for e in rng] == [(0, True), (1, False), (2, True), (3, False)]
    assert [e.fields["fingerprint"] for e in rng] == [starts[s].fingerprint for s in range(4)]
    assert all(e.fields["devices"] == 0 for e in rng)
    # A stored state comes back bit for bit, and restoring it repeats the step's dropout mask.
    state = recorded_rng(BlobStore(tmp_path / "run"), rng[2].fields)
    assert torch.equal(state.state, starts[2].state)
    state.restore()
    first = torch.rand(3)
    state.restore()
    assert torch.equal(torch.rand(3), first)
