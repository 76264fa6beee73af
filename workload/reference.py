"""The reference workload: the deterministic LLaMA-style model on the embedded corpus, as a `Workload`.

    w = build(load_config("tiny"))                 # or build(cfg.to_dict(), device)
    loss = run_step(w, 0)                          # workload.protocol.run_step

``build`` is the factory `sdc record` and `sdc replay` use when no ``--workload`` is
named (entry point ``workload.reference:build``). On several ranks each takes its
replica's share of every microbatch (and its slice of the sequence with sp); the step
loss is the whole model's, the same on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tracer.determinism import configure_determinism
from tracer.parallel import Layout
from workload.data import TokenData
from workload.model import Transformer
from workload.model_parallel import Groups, clip_grad_norm, process_groups, reduce_gradients
from workload.protocol import Workload
from workload.reference_config import Config, OptimConfig


@dataclass
class Reference(Workload):
    """The reference model, optimizer and data of one rank, built identically on every node."""

    cfg: Config = Config()
    data: TokenData | None = None
    groups: Groups | None = None

    @functools.cached_property
    def sharded(self) -> frozenset[str]:
        """Parameters split across tensor-parallel ranks; the others are whole on every rank."""
        return frozenset(n for n, _ in self.model.named_parameters() if self.model.shard_dim(n) is not None)

    @functools.cached_property
    def replicated(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.model.named_parameters()) - self.sharded

    @property
    def _groups(self) -> Groups:
        assert self.groups is not None
        return self.groups

    def microbatches(self, step: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        assert self.data is not None
        device = next(self.model.parameters()).device
        batches = []
        for mb in range(self.cfg.data.microbatches):
            inputs, targets = self.data.batch(step, mb)
            if self.layout.dp > 1:
                share = inputs.shape[0] // self.layout.dp
                inputs, targets = (t.narrow(0, self._groups.dp_rank * share, share) for t in (inputs, targets))
            batches.append((inputs.to(device), targets.to(device)))
        return batches

    def inputs(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return batch[0]

    def start_step(self, step: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.optim.lr_at(step)

    def loss(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        k = self.cfg.data.microbatches
        logits = self.model(inputs)  # (B, T, V); (B, T / tp, V) with sp
        if self.layout.sp and self.layout.tp > 1:
            # This rank's tokens' share of the mean over the whole sequence: the shares sum to it.
            local = self.model.sequence_shard(targets)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), local.reshape(-1), reduction="sum")
            return loss / (targets.numel() * k)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1)) / k

    def finish_backward(self, step: int) -> torch.Tensor | None:
        if self.layout.world_size > 1:
            reduce_gradients(self.model, self._groups, self.replicated)
        if self.grad_clip > 0:
            if self.layout.tp > 1:
                clip_grad_norm(self.model, self._groups, self.sharded, self.grad_clip)
            else:
                return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip, foreach=False)
        return None

    def step_loss(self, losses: Sequence[float]) -> float:
        total = float(sum(losses))
        if self.layout.world_size == 1:
            return total
        # Sum the sequence slices' losses over tp (each rank has its slice's with sp), average over replicas.
        t = torch.tensor([total], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t[0]) / self.layout.dp / (1 if self.layout.sp else self.layout.tp)


def build(config: Config | Mapping[str, Any], device: str | torch.device = "cpu") -> Reference:
    """Apply determinism settings, then build model (seeded init, this rank's shard), optimizer and data."""
    cfg = config if isinstance(config, Config) else Config.from_dict(config, source="the workload config")
    configure_determinism(cfg.train.seed, cfg.train.threads)
    p = cfg.parallel
    groups = process_groups(Layout(dp=p.dp, tp=p.tp, sp=p.sp))
    model = Transformer(cfg.model, groups)
    model.init_weights(torch.Generator().manual_seed(cfg.train.seed))
    model.to(device)
    data = TokenData(cfg.data)
    return Reference(
        model=model,
        optimizer=make_optimizer(model, cfg.optim),
        config=cfg.to_dict(),
        seed=cfg.train.seed,
        data_order_fingerprint=data.fingerprint,
        layout=groups.layout,
        grad_clip=cfg.optim.grad_clip,
        cfg=cfg,
        data=data,
        groups=groups,
    )


def make_optimizer(model: torch.nn.Module, o: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer `o` names (per-parameter loops, not foreach: the same kernels on every device)."""
    if o.name == "adamw":
        return torch.optim.AdamW(
            model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, foreach=False
        )
    return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, foreach=False)
