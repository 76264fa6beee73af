"""optimizer_tensors: an optimizer's gradients and parameters under the names the log records them by."""

from __future__ import annotations

import torch
from torch import nn

from tracer.optimizer_tensors import optimizer_gradients, optimizer_parameters
from tracer.sites import named_parameters


def test_named_parameters_keep_their_names_and_others_their_place_in_the_optimizer() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1, bias=False))
    extra = torch.zeros(2, requires_grad=True)  # a tensor the optimizer updates that the model does not hold
    opt = torch.optim.SGD([{"params": list(model[0].parameters())}, {"params": [model[1].weight, extra]}], lr=0.1)
    names = {id(p): n for n, p in named_parameters(model)}
    assert [n for n, _ in optimizer_parameters(opt, names)] == ["0.weight", "0.bias", "1.weight", "optimizer.group1.1"]
    assert optimizer_gradients(opt, names) == []  # no gradient yet
    model(torch.randn(4, 3)).sum().backward()
    grads = optimizer_gradients(opt, names)
    assert [n for n, _ in grads] == ["0.weight", "0.bias", "1.weight"]  # `extra` has none
    assert all(g is p.grad for (_, g), p in zip(grads, [*model[0].parameters(), model[1].weight]))
