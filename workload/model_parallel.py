"""Megatron-style tensor and sequence parallelism for the reference model, on torch.distributed.

    groups = process_groups(Layout(dp=2, tp=2, sp=True))   # every rank, after init_process_group
    model = Transformer(cfg.model, groups)

Tensor parallelism splits attention heads and the feed-forward hidden width over the
``tp`` ranks of a group: the first linears are column-parallel (each rank computes
its own heads or hidden units), the last one row-parallel, so each rank's
submodule output is a *partial sum* over its shard. A collective then combines the
partials: an all-reduce, or with sequence parallelism a reduce-scatter that leaves
each rank its slice of the sequence (and an all-gather before the submodule brings
the whole sequence back). The partial output before the reduce-scatter is the
submodule's own output, so it is a traced site: the point where the reference
study compared and synchronised its nodes.

Every collective runs through a `Collective` module (``layers.{i}.attention_in``,
``..._out``, ``feed_forward_in``, ``..._out``) or `reduce_gradients`, and shows its
input and output to `tracer.collectives` in forward and backward. gloo on CPU,
NCCL on GPUs; results are deterministic for a fixed layout, not across layouts.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tracer.collectives import observe
from tracer.errors import UsageError
from tracer.intercept import own_ops
from tracer.log.records import Phase
from tracer.parallel import Layout

# (forward op, backward op) of each kind of boundary; None is the identity.
ENTER = {False: (None, "all_reduce"), True: ("all_gather", "reduce_scatter")}  # keyed by sp
LEAVE = {False: ("all_reduce", None), True: ("reduce_scatter", "all_gather")}


@dataclass(frozen=True)
class Groups:
    """This rank's process groups and coordinates for one layout."""

    layout: Layout
    rank: int
    tp: Any  # the tensor-parallel group of this rank (None: single rank)
    dp: Any  # the data-parallel group of this rank

    @property
    def tp_rank(self) -> int:
        return self.layout.coords(self.rank)["tp"]

    @property
    def dp_rank(self) -> int:
        return self.layout.coords(self.rank)["dp"]


SINGLE = Groups(Layout(), 0, None, None)
_cache: dict[Layout, Groups] = {}


def process_groups(layout: Layout) -> Groups:
    """Create (once per process and layout) the tensor- and data-parallel groups; collective on every rank."""
    if layout.world_size == 1:
        return SINGLE
    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError(
            f"parallel layout dp={layout.dp} x tp={layout.tp} needs {layout.world_size} ranks under torch.distributed; "
            f"run `sdc record --nproc {layout.world_size}` or start the script with torchrun"
        )
    if layout not in _cache:
        layout.check(dist.get_world_size())
        rank, mine = dist.get_rank(), {}
        # new_group is collective: every rank creates every group, in the same order.
        for d in range(layout.dp):
            ranks = [d * layout.tp + t for t in range(layout.tp)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine["tp"] = group
        for t in range(layout.tp):
            ranks = [d * layout.tp + t for d in range(layout.dp)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine["dp"] = group
        _cache[layout] = Groups(layout, rank, mine["tp"], mine["dp"])
    return _cache[layout]


def communicate(op: str | None, x: torch.Tensor, group: Any, point: str, phase: Phase) -> torch.Tensor:
    """Run one collective over the sequence dimension (1) of ``x``, observed on both sides."""
    if op is None:
        return x
    x = observe(point, op, phase, "in", x)
    n = dist.get_world_size(group)
    with own_ops():
        if op == "all_reduce":
            y = x.contiguous().clone()
            dist.all_reduce(y, group=group)
        else:
            xs = x.movedim(1, 0).contiguous()  # (T, B, C): the collectives split dim 0
            size = list(xs.shape)
            size[0] = size[0] // n if op == "reduce_scatter" else size[0] * n
            ys = torch.empty(size, dtype=xs.dtype, device=xs.device)
            if op == "reduce_scatter":
                dist.reduce_scatter_single(ys, xs, group=group)
            else:
                dist.all_gather_single(ys, xs, group=group)
            y = ys.movedim(0, 1).contiguous()  # (B, T', C)
    return observe(point, op, phase, "out", y)


class _Communicate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, boundary: Collective) -> torch.Tensor:
        ctx.boundary = boundary
        return communicate(boundary.ops[0], x, boundary.group, boundary.point, Phase.FORWARD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        b = ctx.boundary
        return communicate(b.ops[1], grad, b.group, b.point, Phase.BACKWARD), None


class Collective(nn.Module):
    """Where a tensor-parallel submodule's input enters (``ENTER``) or its partial output leaves (``LEAVE``)."""

    def __init__(self, point: str, ops: tuple[str | None, str | None], group: Any) -> None:
        super().__init__()
        self.point, self.ops, self.group = point, ops, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Communicate.apply(x, self)

    def extra_repr(self) -> str:
        return f"forward={self.ops[0]}, backward={self.ops[1]}"


def reduce_gradients(model: nn.Module, groups: Groups, replicated: AbstractSet[str]) -> None:
    """Complete the gradients before the optimizer: sum partial ones over the sequence shards, average over replicas.

    With sequence parallelism each tensor-parallel rank sees a slice of the sequence,
    so parameters it holds whole (``replicated``: norms, embeddings, output) get partial
    gradients. One flat bucket per collective keeps it to two all-reduces per step.
    """
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    if groups.layout.sp and groups.layout.tp > 1:
        _all_reduce_bucket([p for n, p in params if n in replicated], groups.tp, "sequence_parallel_grads", 1)
    if groups.layout.dp > 1:
        _all_reduce_bucket([p for _, p in params], groups.dp, "data_parallel_grads", groups.layout.dp)


def _all_reduce_bucket(params: list[nn.Parameter], group: Any, point: str, divide: int) -> None:
    if not params:
        return
    with own_ops(), torch.no_grad():
        flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = communicate("all_reduce", flat, group, point, Phase.GRAD)
    with own_ops(), torch.no_grad():
        if divide > 1:
            flat = flat / divide
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.grad.numel()].view_as(p.grad))
            offset += p.grad.numel()


def clip_grad_norm(model: nn.Module, groups: Groups, sharded: AbstractSet[str], max_norm: float) -> None:
    """`torch.nn.utils.clip_grad_norm_` over the whole (unsharded) model: sharded parameters' squares summed over tp."""
    with own_ops(), torch.no_grad():
        grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
        local = torch.stack([g.double().pow(2).sum() for n, g in grads if n in sharded]).sum().reshape(1)
    local = communicate("all_reduce", local, groups.tp, "grad_norm", Phase.GRAD)
    with own_ops(), torch.no_grad():
        total = local[0] + sum(g.double().pow(2).sum() for n, g in grads if n not in sharded)
        coef = torch.clamp(max_norm / (total.sqrt() + 1e-6), max=1.0)
        for _, g in grads:
            g.mul_(coef.to(g.dtype))
