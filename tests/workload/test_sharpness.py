"""Sharpness: the estimate agrees with the full Hessian's top eigenvalue, and recording it changes no bit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call

from faults import load_profile
from jobs.record import record_run
from tests.support import ONE_FLIP, events, small_config
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, TensorRecord
from workload.protocol import Workload
from workload.sharpness import EXACT, FINITE_DIFFERENCE, sharpness


class Regression(Workload):
    """A 2-layer tanh network on a fixed batch, split into two microbatches of the same data."""

    def microbatches(self, step: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(16, 3, generator=gen, dtype=torch.float64)
        y = torch.randn(16, 2, generator=gen, dtype=torch.float64)
        return [(x, y), (x + 1, y)]

    def loss(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y) / 2


def regression() -> Regression:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    return Regression(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config={})


def full_hessian_top(w: Regression, step: int) -> float:
    """The largest eigenvalue of the whole Hessian of the first microbatch's mean loss."""
    names = [n for n, _ in w.model.named_parameters()]
    shapes = [p.shape for p in w.model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in w.model.parameters()])
    x, y = w.microbatches(step)[0]

    def loss(theta: torch.Tensor) -> torch.Tensor:
        parts = dict(zip(names, (t.reshape(s) for t, s in zip(theta.split([s.numel() for s in shapes]), shapes))))
        return nn.functional.mse_loss(functional_call(w.model, parts, (x,)), y)

    h = torch.autograd.functional.hessian(loss, flat)
    return float(torch.linalg.eigvalsh(h)[-1])


@pytest.mark.parametrize("method, rtol", [(EXACT, 1e-8), (FINITE_DIFFERENCE, 1e-4)])
def test_value_is_the_full_hessians_top_eigenvalue(method: str, rtol: float) -> None:
    w = regression()
    expected = full_hessian_top(w, 0)
    s = sharpness(w, 0, iterations=60, tol=1e-12, method=method, fd_eps=1e-5)
    assert s.method == method and s.iterations <= 60
    assert s.value == pytest.approx(expected, rel=rtol), (s, expected)
    assert s.residual < 1e-3, s


def test_leaves_parameters_gradients_and_rng_as_they_were() -> None:
    w = regression()
    w.loss(0, w.microbatches(0)[0]).backward()
    before = [(p.detach().clone(), p.grad.clone()) for p in w.model.parameters()]
    rng = torch.get_rng_state()
    for method in (EXACT, FINITE_DIFFERENCE):
        sharpness(w, 0, iterations=5, method=method)
    assert torch.equal(torch.get_rng_state(), rng)
    for (value, grad), p in zip(before, w.model.parameters()):
        assert torch.equal(p.detach(), value) and torch.equal(p.grad, grad)


def test_the_same_seed_gives_the_same_estimate() -> None:
    w = regression()
    a, b, c = (sharpness(w, 1, iterations=3, seed=s) for s in (0, 0, 1))
    assert a == b and a.value != c.value and not a.converged


def tensors(run: Path) -> list[tuple]:
    return [
        (r.step, r.microbatch, r.name, r.phase, r.fingerprint)
        for r in LogReader(rank_dir(run, 0)).records()
        if isinstance(r, TensorRecord)
    ]


def other_events(run: Path) -> list[tuple]:
    """Every event but the clock-dependent and the sharpness ones, by kind, step and fields."""
    return [
        (r.kind, r.step, sorted(r.fields.items()))
        for r in LogReader(rank_dir(run, 0)).records()
        if isinstance(r, EventRecord) and r.kind not in ("step", "sharpness")
    ]


@pytest.mark.slow
def test_recording_sharpness_changes_no_recorded_bit(tmp_path: Path) -> None:
    """On a faulty node too: the estimate runs outside the fault emulator, which draws no extra random numbers."""
    (tmp_path / "flip.toml").write_text(ONE_FLIP, encoding="utf-8")
    profile = load_profile(tmp_path / "flip.toml")
    runs = {}
    for name, k in (("plain", 0), ("sharp", 4)):
        runs[name] = tmp_path / name
        record_run(small_config(), runs[name], node_label="node", progress=False, fault_profile=profile, sharpness=k)
    assert tensors(runs["plain"]) == tensors(runs["sharp"])
    assert other_events(runs["plain"]) == other_events(runs["sharp"])
    assert any(kind == "fault" for kind, _, _ in other_events(runs["sharp"]))
    logged = events(runs["sharp"], "sharpness")
    assert [e.step for e in logged] == [0, 2, 4]  # every checkpoint, the final state's included
    assert not events(runs["plain"], "sharpness")
    for e in logged:
        assert e.fields["method"] == EXACT and e.fields["microbatch"] == 0 and 1 <= e.fields["iterations"] <= 4
        assert e.fields["value"] > 0 and isinstance(e.fields["converged"], bool)
