"""Which ops reach the interceptors: sdctrace's own ops and plain optimizer steps never do, and
everything an emulator rule could touch still does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from faults import FaultEmulator
from faults.abft import AbftChecker
from tracer.intercept import active, own_ops

# Every forward and backward add_ (a gradient accumulated into .grad) and mul is stuck at 9.
ADD_AND_MUL = '[[fault]]\nops = ["add_", "mul"]\nkind = "stuck"\nvalue = 9.0\n'


class Seen(TorchDispatchMode):
    """A user's own mode: records the ops that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def node(write_profile, model: nn.Module, profile: str = ADD_AND_MUL) -> tuple[FaultEmulator, AbftChecker, list]:
    log: list[tuple[str, dict]] = []
    hooks = {"clock": lambda: (0, 0), "sink": lambda kind, fields: log.append((kind, fields))}
    return FaultEmulator(write_profile(profile), model, **hooks), AbftChecker(model, **hooks), log


def kinds(log: list) -> list[str]:
    return [kind for kind, _ in log]


def test_own_ops_switch_the_interceptors_off_and_back_on_in_order(write_profile) -> None:
    model = nn.Linear(4, 4)
    emulator, checker, log = node(write_profile, model)
    x = torch.ones(3, 4)
    with emulator, checker:
        assert active() == (emulator, checker)
        with own_ops():
            assert active() == ()
            with own_ops():
                assert active() == ()
            y = model(x) * 2  # neither corrupted nor checked
        assert active() == (emulator, checker)
        z = x * 2
    assert log == [("fault", log[0][1])] and log[0][1]["op"] == "aten.mul.Tensor"
    assert torch.equal(y, (x @ model.weight.T + model.bias) * 2) and 9.0 in z


def test_a_users_dispatch_mode_stays_and_own_ops_still_pass_untouched(write_profile) -> None:
    model = nn.Linear(4, 4)
    emulator, checker, log = node(write_profile, model)
    x = torch.ones(3, 4)
    with emulator, checker, Seen() as seen:
        with own_ops():
            assert _get_current_dispatch_mode_stack() == [seen] and active() == ()
            y = model(x) * 2
        z = x * 2
    assert [kind for kind, _ in log] == ["fault"] and torch.equal(y, (x @ model.weight.T + model.bias) * 2)
    assert "aten.addmm.default" in seen.ops and 9.0 in z


def optimizer_steps(model: nn.Module, make: Callable[[list], torch.optim.Optimizer]) -> list[list]:
    """The interceptors active as each step of ``make``'s optimizer starts and ends (hooks after the global ones)."""
    stacks: list[tuple] = []
    optimizer = make(list(model.parameters()))
    optimizer.register_step_pre_hook(lambda *_: stacks.append(active()))
    optimizer.register_step_post_hook(lambda *_: stacks.append(active()))
    return optimizer, stacks


def test_a_plain_optimizer_step_runs_without_them_and_nothing_in_it_is_hit(write_profile) -> None:
    model = nn.Linear(4, 1)
    emulator, checker, log = node(write_profile, model)
    optimizer, stacks = optimizer_steps(model, lambda p: torch.optim.AdamW(p, lr=0.1))
    with emulator, checker:
        model(torch.ones(2, 4)).sum().backward()
        hits = len(log)
        optimizer.step()
        assert active() == (emulator, checker)
    assert stacks == [(), ()]
    assert log[hits:] == []  # AdamW's add_ and mul_ have no phase: never corrupted, paused or not


def test_steps_that_run_a_forward_or_sit_in_the_backward_keep_them(write_profile) -> None:
    model = nn.Linear(4, 1)
    emulator, checker, log = node(write_profile, model)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        return loss

    optimizer, stacks = optimizer_steps(model, lambda p: torch.optim.SGD(p, lr=0.1))
    with emulator, checker:
        optimizer.step(closure)
        assert "abft" in kinds(log) and stacks == [(emulator, checker)] * 2
        # Optimizer in backward: a step per parameter, run by the autograd engine once its gradient is final.
        stacks.clear()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: optimizer.step())
        model(torch.ones(2, 4)).sum().backward()
        assert stacks == [(emulator, checker)] * 4


def test_a_step_that_raises_leaves_them_paused_only_until_the_next_forward(write_profile) -> None:
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 4))
    profile = '[[fault]]\nops = ["addmm"]\nsites = "1"\nphases = ["forward"]\nkind = "stuck"\nvalue = 9.0\n'
    emulator, checker, log = node(write_profile, model, profile)
    optimizer = torch.optim.Adam(model.parameters())  # refuses the embedding's sparse gradient
    tokens = torch.tensor([1, 2])
    with emulator, checker:
        model(tokens).sum().backward()
        with pytest.raises(RuntimeError, match="sparse"):
            optimizer.step()
        log.clear()
        model(tokens)
        assert kinds(log) == ["fault", "abft"] and active() == (emulator, checker)
        with pytest.raises(RuntimeError, match="sparse"):
            optimizer.step()
    assert active() == ()
