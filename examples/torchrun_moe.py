"""An expert-parallel mixture-of-experts job: each rank holds its share of every block's experts, and tokens travel
to their expert and back by all-to-all. The same module is the workload factory ``build``.

From the repository root (``--workload`` imports ``examples.torchrun_moe`` from there)::

    sdc record --workload examples.torchrun_moe:build --nproc 2 --sites 'blocks\\.\\d+\\.moe\\.experts\\.\\d+' \\
        --out runs/moe
    sdc record --workload examples.torchrun_moe:build --nproc 2 --sites 'blocks\\.\\d+\\.moe\\.experts\\.\\d+' \\
        --out runs/moe-sick --fault-profile my-expert3-fault.toml   # a rule with ranks = [1], sites on expert 3
    sdc diff --golden runs/moe --suspect runs/moe-sick --db moe.duckdb
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m examples.torchrun_moe --out runs/moe

examples/torchrun_fsdp2.py's small transformer and workload (random tokens, AdamW), with each block's ``mlp``
replaced by a top-1 mixture of ``model.experts`` experts (`MoE`, written as torchtitan's MoE is: a router, then
dispatch, experts, combine). Expert ``e`` lives on rank ``e // (experts / world size)``, under its **global**
index: rank 1 of 2 holds ``blocks.N.moe.experts.2`` and ``.3``, so a site's name says which expert it is. Every
other parameter is replicated: each rank draws its own batches (data parallel) and the replicated gradients are
averaged by one all-reduce (``data_parallel_grads``). Per block and microbatch:

- ``dispatch``: every rank sends each of its tokens to the rank that holds the token's expert
  (``all_to_all_single`` on gloo), observed (`tracer.collectives`) as ``blocks.N.moe.dispatch.all_to_all.in`` /
  ``.out``;
- each local expert runs once on the tokens all ranks routed to it, **also when there are none**: its site
  record then has the shape ``float32[0,32]``, so the log says "no token this microbatch" where a missing
  record would be a hole;
- ``combine``: the expert outputs go back to the tokens' ranks (``blocks.N.moe.combine.all_to_all``), weighted
  by the router's gate. In backward the same two exchanges run in reverse, recorded as phase backward.

A fault in expert 3 is rank 1's (it holds it) first divergence at ``blocks.N.moe.experts.3``; rank 0 sees it
later, at the combine's output (its tokens that expert 3 served) or in the all-reduced gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from examples.torchrun_fsdp2 import CONFIG, Attention, RandomTokensLM, job_arguments, job_config, record, with_defaults
from tracer import Layout, configure_determinism
from tracer.collectives import observe
from tracer.log import Phase

SITES = r"blocks\.\d+\.moe\.experts\.\d+"  # every expert this rank holds, by its global index
MOE_CONFIG = {
    **CONFIG,
    "model": {**CONFIG["model"], "experts": 4, "hidden": 64},
    "train": {**CONFIG["train"], "clip": 0.0},
    "parallel": {},
}


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def exchange(x: torch.Tensor, send: list[int], receive: list[int], point: str, phase: Phase) -> torch.Tensor:
    """``all_to_all_single`` of the rows of ``x``: ``send[r]`` rows to rank ``r``, ``receive[r]`` rows from it,
    observed on both sides (the identity on one rank)."""
    if not dist.is_initialized():
        return x
    x = observe(point, "all_to_all", phase, "in", x)
    y = x.new_empty((sum(receive), *x.shape[1:]))
    dist.all_to_all_single(y, x.contiguous(), output_split_sizes=receive, input_split_sizes=send)
    return observe(point, "all_to_all", phase, "out", y)


class _AllToAll(torch.autograd.Function):
    """The exchange, differentiable: its backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], receive: list[int], point: str) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.point = send, receive, point
        return exchange(x, send, receive, point, Phase.FORWARD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return exchange(grad, ctx.receive, ctx.send, ctx.point, Phase.BACKWARD), None, None, None


def tokens_for_me(counts: torch.Tensor, ranks: int) -> torch.Tensor:
    """From every rank's tokens-per-expert ``counts`` (E,), how many tokens each rank sends to each of this
    rank's experts: (ranks, E / ranks)."""
    if ranks == 1:
        return counts.view(1, -1)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts)  # equal splits: rank r gets everyone's counts of its experts
    return received.view(ranks, -1)


def inverse(permutation: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(permutation).scatter_(0, permutation, torch.arange(len(permutation)))


class MoE(nn.Module):
    """Top-1 routing over ``experts`` experts spread over the ranks; this rank keeps its ``experts / ranks``."""

    def __init__(self, point: str, width: int, hidden: int, experts: int) -> None:
        super().__init__()
        rank, ranks = world()
        assert experts % ranks == 0, f"{experts} experts do not split over {ranks} ranks"
        self.point, self.count, self.ranks = point, experts, ranks
        self.router = nn.Linear(width, experts, bias=False)
        # Every expert drawn on every rank in one order (the same weights under any world size), this rank's kept.
        every = [nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)) for _ in range(experts)]
        per = experts // ranks
        self.experts = nn.ModuleDict({str(e): every[e] for e in range(rank * per, (rank + 1) * per)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        tokens = x.reshape(b * t, c)  # (N, C)
        gate, choice = torch.softmax(self.router(tokens), dim=-1).max(dim=-1)  # (N,), (N,)
        order = torch.argsort(choice, stable=True)  # this rank's tokens grouped by expert, so by rank
        counts = torch.bincount(choice, minlength=self.count)  # (E,)
        mine = tokens_for_me(counts, self.ranks)  # (ranks, E / ranks): tokens from each rank for each local expert
        send, receive = counts.view(self.ranks, -1).sum(1).tolist(), mine.sum(1).tolist()
        inbox = _AllToAll.apply(tokens[order], send, receive, f"{self.point}.dispatch")  # (M, C) by rank, expert
        starts = (mine.flatten().cumsum(0) - mine.flatten()).view_as(mine)
        rows, outputs = [], []
        for j, expert in enumerate(self.experts.values()):  # every expert, also one with no token: (0, C)
            index = torch.cat([torch.arange(s, s + n) for s, n in zip(starts[:, j].tolist(), mine[:, j].tolist())])
            rows.append(index)
            outputs.append(expert(inbox[index]))
        served = torch.cat(outputs)[inverse(torch.cat(rows))]  # (M, C) in the order the rows came
        back = _AllToAll.apply(served, receive, send, f"{self.point}.combine")  # (N, C) in ``order``
        return (back[inverse(order)] * gate.unsqueeze(-1)).view(b, t, c)


class Block(nn.Module):
    def __init__(self, index: int, width: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads=2)
        self.moe = MoE(f"blocks.{index}.moe", width, hidden, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.moe(self.norm2(x))


class MoETransformer(nn.Module):
    def __init__(self, vocab: int, width: int, blocks: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(i, width, hidden, experts) for i in range(blocks))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # (B, T, V)


class ExpertParallelLM(RandomTokensLM):
    """`RandomTokensLM` whose replicated gradients are averaged over the ranks; an expert's gradient already holds
    every rank's tokens, so it is divided by the world size only (the loss is the mean over the ranks)."""

    def finish_backward(self, step: int) -> torch.Tensor | float | None:
        _, ranks = world()
        if ranks == 1:
            return None
        named = [(n, p) for n, p in self.model.named_parameters() if p.grad is not None]
        shared = [p for n, p in named if ".experts." not in n]
        with torch.no_grad():
            for p in (p for n, p in named if ".experts." in n):
                p.grad.div_(ranks)
            flat = observe(
                "data_parallel_grads", "all_reduce", Phase.GRAD, "in", torch.cat([p.grad.flatten() for p in shared])
            )
            dist.all_reduce(flat)
            flat = observe("data_parallel_grads", "all_reduce", Phase.GRAD, "out", flat)
            offset = 0
            for p in shared:
                p.grad.copy_(flat[offset : offset + p.grad.numel()].view_as(p.grad) / ranks)
                offset += p.grad.numel()
        return None


def build(config: Mapping[str, Any], device: torch.device) -> ExpertParallelLM:
    """The workload factory (`workload.protocol`): the experts split over all the ranks, the rest replicated."""
    config = with_defaults(config, MOE_CONFIG)
    m, t = config["model"], config["train"]
    configure_determinism(t["seed"], t["threads"])  # the same weights on every rank
    model = MoETransformer(m["vocab"], m["width"], m["blocks"], m["hidden"], m["experts"]).to(device)
    _, ranks = world()
    return ExpertParallelLM(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False),
        config=config,
        seed=t["seed"],
        layout=Layout(dp=ranks),
        data_order_fingerprint=f"random-tokens/seed={t['seed']}/replicas={ranks}",
    )


def main() -> None:
    args = job_arguments(__doc__).parse_args()
    dist.init_process_group("gloo")
    try:
        record(build(job_config(args), torch.device("cpu")), args, entry="examples.torchrun_moe:build", sites=SITES)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
