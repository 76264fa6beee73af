"""Deterministic training of the reference workload, traced into a run directory.

``record_run`` is what ``sdc record`` runs. ``build`` and ``train_step`` are split
out so a replayer can rebuild the same objects and re-execute any one step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from tqdm import tqdm

from faults import FaultEmulator, FaultProfile
from faults.abft import AbftChecker
from tracer.determinism import configure_determinism
from tracer.device import is_lazy, mark_step, resolve_device, to_host
from tracer.errors import UsageError
from tracer.log import prepare_out_dir
from tracer.options import RunInfo, TraceOptions
from tracer.parallel import Layout
from tracer.sites import SiteSpec
from tracer.tracing import Tracer
from workload.config import Config, OptimConfig
from workload.data import TokenData
from workload.model import Transformer
from workload.model_parallel import Groups, clip_grad_norm, process_groups, reduce_gradients


@dataclass
class Workload:
    """The objects one training process needs, built identically on every node."""

    cfg: Config
    model: Transformer
    optimizer: torch.optim.Optimizer
    data: TokenData
    groups: Groups

    @property
    def layout(self) -> Layout:
        return self.groups.layout

    @functools.cached_property
    def sharded(self) -> frozenset[str]:
        """Parameters split across tensor-parallel ranks; the others are whole on every rank."""
        return frozenset(n for n, _ in self.model.named_parameters() if self.model.shard_dim(n) is not None)

    @functools.cached_property
    def replicated(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.model.named_parameters()) - self.sharded


@dataclass
class RunSummary:
    out: Path
    steps: int
    final_loss: float
    wall_s: float
    losses: list[float]


def build(cfg: Config, device: str | torch.device = "cpu") -> Workload:
    """Apply determinism settings, then build model (seeded init, this rank's shard), optimizer and data."""
    configure_determinism(cfg.train.seed, cfg.train.threads)
    p = cfg.parallel
    groups = process_groups(Layout(dp=p.dp, tp=p.tp, sp=p.sp))
    model = Transformer(cfg.model, groups)
    model.init_weights(torch.Generator().manual_seed(cfg.train.seed))
    model.to(device)
    return Workload(cfg, model, make_optimizer(model, cfg.optim), TokenData(cfg.data), groups)


def make_optimizer(model: torch.nn.Module, o: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer `o` names (per-parameter loops, not foreach: the same kernels on every device)."""
    if o.name == "adamw":
        return torch.optim.AdamW(
            model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, foreach=False
        )
    return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, foreach=False)


class StepObserver(Protocol):
    """What `train_step` reports to: a `Tracer`, or replay's lighter bookkeeping."""

    def microbatch(self, index: int, inputs: torch.Tensor | None = None) -> None: ...
    def loss(self, value: torch.Tensor | float) -> None: ...


def train_step(w: Workload, step: int, tracer: StepObserver | None = None, *, update: bool = True) -> float:
    """One optimizer step over ``cfg.data.microbatches`` microbatches; returns the step's loss.

    With ``update=False`` the step stops before the optimizer, leaving the clipped
    gradients in ``.grad`` (replay compares them and discards the step). On several
    ranks each takes its replica's share of every microbatch (and its slice of the
    sequence with sp); the loss returned is the whole model's, the same on every rank.
    """
    cfg, model, opt = w.cfg, w.model, w.optimizer
    device = next(model.parameters()).device
    for group in opt.param_groups:
        group["lr"] = cfg.optim.lr_at(step)
    opt.zero_grad(set_to_none=True)
    k = cfg.data.microbatches
    losses: list[torch.Tensor] = []
    layout = w.layout
    for mb in range(k):
        inputs, targets = w.data.batch(step, mb)
        if layout.dp > 1:
            share = inputs.shape[0] // layout.dp
            inputs, targets = (t.narrow(0, w.groups.dp_rank * share, share) for t in (inputs, targets))
        inputs, targets = inputs.to(device), targets.to(device)
        if tracer is not None:
            tracer.microbatch(mb, inputs=inputs)
        logits = model(inputs)  # (B, T, V); (B, T / tp, V) with sp
        if layout.sp and layout.tp > 1:
            # This rank's tokens' share of the mean over the whole sequence: the shares sum to it.
            local = model.sequence_shard(targets)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), local.reshape(-1), reduction="sum")
            loss = loss / (targets.numel() * k)
        else:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1)) / k
        loss.backward()
        if tracer is not None:
            tracer.loss(loss)
        losses.append(loss.detach())
    if layout.world_size > 1:
        reduce_gradients(model, w.groups, w.replicated)
    if cfg.optim.grad_clip > 0:
        if layout.tp > 1:
            clip_grad_norm(model, w.groups, w.sharded, cfg.optim.grad_clip)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip, foreach=False)
    if update:
        opt.step()
    # The step's end: XLA runs the step's graph here, so reading the losses runs nothing more.
    mark_step(device)
    total = sum(v.item() for v in to_host(losses))
    return _whole_loss(total, w.groups) if layout.world_size > 1 else total


def _whole_loss(local: float, groups: Groups) -> float:
    """Sum the sequence slices' losses over tp (each rank has its slice's with sp), average over replicas."""
    t = torch.tensor([local], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t[0]) / groups.layout.dp / (1 if groups.layout.sp else groups.layout.tp)



def record_run(
    cfg: Config,
    out: str | Path,
    *,
    node_label: str,
    overwrite: bool = False,
    options: TraceOptions | None = None,
    progress: bool = True,
    extra: Mapping[str, Any] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    fault_profile: FaultProfile | None = None,
    fault_seed: int = 0,
    abft: bool = False,
    device: str = "cpu",
) -> RunSummary:
    """Train ``cfg.run.steps`` steps under a Tracer, checkpointing every ``cfg.run.checkpoint_every``.

    ``options`` are the Tracer's (`TraceOptions`: sites, captured tensors, segment size).
    ``fault_profile`` plays an unhealthy node (`faults`) and ``abft`` checks every
    matmul (`faults.abft`); the header's ``extra`` records both, its pairing fields
    stay those of the healthy twin. ``device`` is ``cpu``, ``cuda[:N]`` or ``xla[:N]``.
    """
    options = options or TraceOptions()
    out = Path(out)
    dev = resolve_device(device)
    if is_lazy(dev) and (fault_profile is not None or abft):
        raise UsageError(f"--device {device}: the fault emulator and ABFT run on eager devices only (cpu, cuda)")
    w = build(cfg, dev)
    if w.groups.rank == 0:
        prepare_out_dir(out, overwrite)
    if w.layout.world_size > 1:
        torch.distributed.barrier()  # no rank writes before rank 0 has cleared the directory
    extra = {**dict(extra or {}), **node_header(fault_profile, fault_seed, abft)}
    every = cfg.run.checkpoint_every
    losses: list[float] = []
    start = time.perf_counter()
    run = RunInfo(node_label, config=cfg.to_dict(), seed=cfg.train.seed, data_order_fingerprint=w.data.fingerprint, extra=extra)
    tracer = Tracer(w.model, w.optimizer, out=out, run=run, options=options, parallel=w.layout)
    bar = tqdm(range(cfg.run.steps), desc=f"record {out.name}", unit="step", disable=None if progress and w.groups.rank == 0 else True, leave=False)
    node = emulated_node(tracer, w.model, fault_profile=fault_profile, fault_seed=fault_seed, abft=abft, sites=options.sites)
    with tracer, node:
        for step in bar:
            if every and step % every == 0:
                tracer.checkpoint(step, data={"step": step})
            with tracer.step(step):
                loss = train_step(w, step, tracer)
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}")
            if on_step is not None:
                on_step(step, loss)
        if every:
            tracer.checkpoint(cfg.run.steps, data={"step": cfg.run.steps})
    return RunSummary(out, cfg.run.steps, losses[-1], time.perf_counter() - start, losses)


def node_header(fault_profile: FaultProfile | None, fault_seed: int, abft: bool) -> dict[str, Any]:
    """What a run header's ``extra`` says about the node's emulated faults and ABFT checks."""
    extra: dict[str, Any] = {}
    if fault_profile is not None:
        extra["fault_profile"] = fault_profile.header(fault_seed)
    if abft:
        extra["abft"] = True
    return extra


def emulated_node(
    tracer: Tracer,
    model: torch.nn.Module,
    *,
    fault_profile: FaultProfile | None = None,
    fault_seed: int = 0,
    abft: bool = False,
    sites: SiteSpec = None,
) -> AbstractContextManager[None]:
    """A context in which this node plays an unhealthy one (`faults`) and/or checks every matmul
    (`faults.abft`), logging fault and abft events through `tracer` (enter it first) at its current step.

    Built now, entered later: a profile that does not fit the model fails before anything is recorded.
    """

    def clock() -> tuple[int, int]:
        return tracer.step_index, tracer.microbatch_index

    def sink(kind: str, fields: dict[str, Any]) -> None:
        tracer.event(kind, **fields)

    # Emulator first, checker second: the checker then sees the corrupted results.
    modes: list[FaultEmulator | AbftChecker] = []
    if fault_profile is not None:
        modes.append(FaultEmulator(fault_profile, model, clock=clock, sink=sink, seed=fault_seed, sites=sites))
    if abft:
        modes.append(AbftChecker(model, clock=clock, sink=sink, sites=sites))
    return _entered(modes)


@contextmanager
def _entered(modes: list[FaultEmulator | AbftChecker]) -> Iterator[None]:
    with ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        yield
