"""The tensors an optimizer step reads and writes, under the names the log records them by: what the Tracer
fingerprints before each update (the gradients) and after it (the parameters).

    names = {id(p): name for name, p in named_parameters(model)}
    optimizer_gradients(optimizer, names)   # [(name, local shard of p.grad)] of the parameters with a gradient
    optimizer_parameters(optimizer, names)  # [(name, local shard of p)] of every parameter

A tensor the model does not name (an optimizer given tensors of its own) is ``optimizer.group{g}.{i}``: its index
in the optimizer's param_groups. Each is one comprehension with no Python call per parameter: tiny's step lists 78
tensors, llama3-16l-mini's hundreds, and a call each costs as much again as the comprehension's own work.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tracer.sharding import local_shards


def optimizer_gradients(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> list[tuple[str, torch.Tensor]]:
    """``(name, gradient)`` of each parameter of ``optimizer`` that has one, in its order (a DTensor's local shard)."""
    get = names.get
    return local_shards(
        [
            (name if (name := get(id(p))) is not None else f"optimizer.group{gi}.{pi}", p.grad)
            for gi, group in enumerate(optimizer.param_groups)
            for pi, p in enumerate(group["params"])
            if p.grad is not None
        ]
    )


def optimizer_parameters(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> list[tuple[str, torch.Tensor]]:
    """``(name, parameter)`` of every parameter of ``optimizer``, in its order (a DTensor's local shard)."""
    get = names.get
    return local_shards(
        [
            (name if (name := get(id(p))) is not None else f"optimizer.group{gi}.{pi}", p)
            for gi, group in enumerate(optimizer.param_groups)
            for pi, p in enumerate(group["params"])
        ]
    )
