"""Interceptors see the calls of the ops they name, and nothing else: forward and backward, in the order they
were entered, never sdctrace's own ops; an edit of a forward result flows into the backward that saved it."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from tracer.intercept import Interceptor, active, below_autograd, own_ops

aten = torch.ops.aten


class Seen(Interceptor):
    """Records (op, in the backward) for each call of ``ops`` it sees; optionally replaces results."""

    def __init__(self, *ops: object, edit: object = None, log: list | None = None) -> None:
        self.ops = frozenset(ops)
        self.edit = edit
        self.calls: list[tuple[str, bool]] = []
        self.log = log

    def intercept(self, func, args, kwargs, call):  # noqa: ANN001, ANN201
        if self.log is not None:
            self.log.append(("enter", self))
        out = call(*args, **kwargs)
        self.calls.append((str(func), torch._C._current_graph_task_id() != -1))
        if self.edit is not None:
            with below_autograd():
                self.edit(out)
        if self.log is not None:
            self.log.append(("leave", self))
        return out


def test_only_the_named_ops_reach_it_in_forward_and_backward() -> None:
    model = nn.Linear(3, 2)
    seen = Seen(aten.mm, aten.addmm, aten.exp)
    x = torch.randn(4, 3, requires_grad=True)
    with seen:
        model(x).exp().sum().backward()
    ops = [op for op, _ in seen.calls]
    # linear decomposes into addmm (forward) and mm (the two backward products); t, sum, mul never reach it
    assert ops.count("aten.addmm.default") == 1 and ops.count("aten.exp.default") == 1
    assert sorted(op for op, backward in seen.calls if backward) == ["aten.mm.default", "aten.mm.default"]
    assert active() == ()


def test_the_last_entered_sees_an_op_first_and_calls_it_through_the_others() -> None:
    log: list = []
    outer, inner = Seen(aten.mul, log=log), Seen(aten.mul, aten.add, log=log)
    with inner, outer:
        assert active() == (inner, outer)
        torch.ones(2) * 3
        torch.ones(2) + 1
    assert log == [
        ("enter", outer),
        ("enter", inner),
        ("leave", inner),
        ("leave", outer),
        ("enter", inner),
        ("leave", inner),
    ]


def test_own_ops_and_other_threads_without_one_are_not_seen() -> None:
    seen = Seen(aten.mul)
    with seen:
        with own_ops():
            torch.ones(2) * 2
            assert active() == ()
        worker = threading.Thread(target=lambda: torch.ones(2) * 2)
        worker.start()
        worker.join()
        assert seen.calls == []
        torch.ones(2) * 2
    assert seen.calls == [("aten.mul.Tensor", False)]


def test_an_edited_forward_result_is_what_its_backward_uses() -> None:
    """exp saves its result for the backward: the edit below autograd lands there, with no version error."""
    x = torch.zeros(3, requires_grad=True)

    def double_first(out: torch.Tensor) -> None:
        out[0] = 5.0

    with Seen(aten.exp, edit=double_first):
        y = x.exp()
    y.sum().backward()
    assert y.tolist() == [5.0, 1.0, 1.0]
    assert x.grad.tolist() == [5.0, 1.0, 1.0]  # d exp(x)/dx = exp(x), read from the saved (edited) result


def test_an_interceptor_that_raises_leaves_the_key_off() -> None:
    def boom(out: torch.Tensor) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with Seen(aten.mul, edit=boom):
            torch.ones(2) * 2
    assert active() == ()
    assert torch.equal(torch.ones(2) * 2, torch.full((2,), 2.0))


def test_an_op_that_raises_leaves_the_interceptors_seeing_the_next_ops() -> None:
    with Seen(aten.mul) as seen:
        with pytest.raises(RuntimeError, match="size"):
            torch.ones(2) * torch.ones(3)
        assert active() == (seen,)
        torch.ones(2) * 2
    assert seen.calls == [("aten.mul.Tensor", False)]  # the failed call raised inside the op, before it returned


def test_an_op_keeps_a_kernel_only_while_an_active_interceptor_names_it() -> None:
    def has_kernel(op: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, "TESTING_ONLY_GenericMode")

    first, second = Seen(aten.mul, aten.add), Seen(aten.add)
    with second:
        with first:
            assert has_kernel("aten::mul.Tensor") and has_kernel("aten::add.Tensor")
        assert not has_kernel("aten::mul.Tensor") and has_kernel("aten::add.Tensor")
        torch.ones(2) * 2 + 1
    assert not has_kernel("aten::add.Tensor")
    assert first.calls == [] and second.calls == [("aten.add.Tensor", False)]
