"""The update RMS computed ahead of the step equals the update torch.optim then applies."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from tracer.errors import ConfigError
from tracer.guard import Guard, UpdateRmsSpike
from tracer.guard.update import update_rms
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd momentum wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd nesterov maximize": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, maximize=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam l2 amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
    "adamw maximize foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, maximize=True, foreach=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_predicted_update_is_the_applied_one(name: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    model[2].bias.requires_grad_(False)  # a parameter without a gradient counts for nothing
    opt = OPTIMIZERS[name]([p for p in model.parameters()])
    for step in range(4):  # from empty state to state with momentum / moments
        opt.zero_grad()
        model(torch.randn(16, 6)).square().mean().backward()
        predicted = update_rms(opt)
        before = copy.deepcopy([p.detach() for p in model.parameters() if p.grad is not None])
        opt.step()
        after = [p.detach() for p in model.parameters() if p.grad is not None]
        squares = sum(float((a - b).double().square().sum()) for a, b in zip(after, before))
        applied = math.sqrt(squares / sum(p.numel() for p in after))
        assert predicted == pytest.approx(applied, rel=1e-4), (name, step)


def test_other_optimizers_are_refused_by_name(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="SGD, Adam, AdamW only; this run's optimizer is torch.optim.lbfgs.LBFGS"):
        Tracer(
            model,
            torch.optim.LBFGS(model.parameters()),
            out=tmp_path / "run",
            run=RunInfo("n"),
            options=TraceOptions(activations=False),
            guard=Guard(detectors=(UpdateRmsSpike(),)),
        )


def test_a_tracer_that_cannot_guard_says_why(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    kw = {"out": tmp_path / "run", "run": RunInfo("n"), "guard": Guard()}
    with pytest.raises(ConfigError, match="give the Tracer the optimizer"):
        Tracer(model, None, options=TraceOptions(activations=False), **kw)
    with pytest.raises(ConfigError, match="keep TraceOptions\\(gradients=True\\)"):
        Tracer(
            model,
            torch.optim.SGD(model.parameters(), lr=1.0),
            options=TraceOptions(activations=False, gradients=False),
            **kw,
        )
    with pytest.raises(ConfigError, match="takes a tracer.guard.Guard, found str"):
        Tracer(
            model,
            torch.optim.SGD(model.parameters(), lr=1.0),
            options=TraceOptions(activations=False),
            out=tmp_path / "run",
            run=RunInfo("n"),
            guard="skip",
        )
