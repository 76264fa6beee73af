"""The RMS of the update an optimizer is about to apply, computed before it applies it.

For SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW the update is a closed
form of the gradients, the parameters and the optimizer's state (``optimizer.state``), which
this module evaluates the way ``torch.optim`` does, without touching that state. Any other
optimizer is refused by name (`require_closed_form`): an estimate that silently ignored, say,
LBFGS's line search would make the detector's numbers meaningless.

It costs a few elementwise ops per parameter and one host transfer per step, so only a guard
with `tracer.guard.detectors.UpdateRmsSpike` runs it.
"""

from __future__ import annotations

import math

import torch

from tracer.errors import ConfigError

CLOSED_FORM = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def require_closed_form(optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer whose update this module cannot compute ahead of the step."""
    if type(optimizer) not in CLOSED_FORM:
        names = ", ".join(c.__name__ for c in CLOSED_FORM)
        raise ConfigError(
            f"UpdateRmsSpike computes the update in closed form for {names} only; this run's "
            f"optimizer is {type(optimizer).__module__}.{type(optimizer).__qualname__}: drop "
            "UpdateRmsSpike from the guard's detectors"
        )


@torch.no_grad()
def update_rms(optimizer: torch.optim.Optimizer) -> float:
    """sqrt(mean of the squared update over every parameter element with a gradient)."""
    squares: list[torch.Tensor] = []
    elements = 0
    adam = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
    for group in optimizer.param_groups:
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            state = optimizer.state.get(p, {})
            adamw = isinstance(optimizer, torch.optim.AdamW)
            delta = _adam(group, state, p, grad, adamw) if adam else _sgd(group, state, p, grad)
            squares.append(delta.float().square().sum())
            elements += p.numel()
    if not elements:
        return 0.0
    return math.sqrt(float(torch.stack([s.cpu() for s in squares]).sum()) / elements)


def _sgd(group: dict, state: dict, p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    d = -grad if group.get("maximize", False) else grad
    if group["weight_decay"]:
        d = d + group["weight_decay"] * p
    momentum = group["momentum"]
    if momentum:
        buf = state.get("momentum_buffer")
        buf = d if buf is None else buf * momentum + (1 - group["dampening"]) * d
        d = d + momentum * buf if group["nesterov"] else buf
    return float(group["lr"]) * d


def _adam(group: dict, state: dict, p: torch.Tensor, grad: torch.Tensor, adamw: bool) -> torch.Tensor:
    g = -grad if group.get("maximize", False) else grad
    beta1, beta2 = (float(b) for b in group["betas"])
    lr, wd, eps = float(group["lr"]), group["weight_decay"], group["eps"]
    decoupled = adamw or group.get("decoupled_weight_decay", False)
    if wd and not decoupled:
        g = g + wd * p
    t = float(state.get("step", 0)) + 1
    m = (1 - beta1) * g if "exp_avg" not in state else beta1 * state["exp_avg"] + (1 - beta1) * g
    v = (1 - beta2) * g * g if "exp_avg_sq" not in state else beta2 * state["exp_avg_sq"] + (1 - beta2) * g * g
    if group.get("amsgrad", False) and "max_exp_avg_sq" in state:
        v = torch.maximum(state["max_exp_avg_sq"], v)
    delta = lr / (1 - beta1**t) * m / (v.sqrt() / math.sqrt(1 - beta2**t) + eps)
    return delta + lr * wd * p if wd and decoupled else delta
