"""Record any workload: train it deterministically under a Tracer into a run directory.

    summary = record(cfg.to_dict(), RecordRequest(out=Path("runs/a"), node_label="node-a"))
    summary = record(config, RecordRequest(out=..., node_label=..., workload="my_pkg.train:build"))

This is what ``sdc record`` runs on every rank. The workload comes from the factory
the request names (`workload.protocol`), the reference one by default; with a fault
profile or ABFT the node plays an unhealthy one (`faults.node`), and the header's
``extra`` records both while its pairing fields stay those of the healthy twin.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from faults import FaultProfile, profile_from_header
from faults.node import emulated_node, node_header
from tracer.device import is_lazy, resolve_device
from tracer.errors import UsageError
from tracer.guard import Policy, default_guard
from tracer.log import claim_out_dir
from tracer.options import RunInfo, TraceOptions
from tracer.tracing import Tracer
from workload.config import Config
from workload.protocol import REFERENCE, Workload, build_workload, run_step


@dataclass(frozen=True)
class RecordRequest:
    """Everything about one recording but the workload's own config; the same on every rank."""

    out: Path
    node_label: str
    workload: str = REFERENCE  # the factory's entry point, package.module:function
    overwrite: bool = False
    trace: TraceOptions = TraceOptions()  # what the Tracer records: sites, captured tensors, segment size
    progress: bool = True
    fault_profile: FaultProfile | None = None
    fault_seed: int = 0
    abft: bool = False
    device: str = "cpu"  # cpu, cuda[:N] or xla[:N]
    guard: Policy | None = None  # guard every step with the default detectors and this policy (tracer.guard)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the launcher, which hands the request to every rank's process."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)}, "out": str(self.out),
            "trace": self.trace.to_dict(),
            "fault_profile": self.fault_profile.header(self.fault_seed) if self.fault_profile is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordRequest:
        profile = profile_from_header(data["fault_profile"]) if data["fault_profile"] else None
        trace = TraceOptions.from_dict(data["trace"], source="sdc record")
        return cls(**{**data, "out": Path(data["out"]), "trace": trace, "fault_profile": profile})


@dataclass
class RunSummary:
    out: Path
    steps: int
    final_loss: float
    wall_s: float
    losses: list[float]


def record(
    config: Config | Mapping[str, Any],
    request: RecordRequest,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> RunSummary:
    """Train ``config``'s ``run.steps`` steps under a Tracer, checkpointing every ``run.checkpoint_every``."""
    config = config.to_dict() if isinstance(config, Config) else dict(config)
    dev = resolve_device(request.device)
    if is_lazy(dev) and (request.fault_profile is not None or request.abft):
        raise UsageError(f"--device {request.device}: the fault emulator and ABFT run on eager devices only (cpu, cuda)")
    w = build_workload(request.workload, config, dev)
    rank = torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
    lock = claim_out_dir(request.out, role="train", overwrite=request.overwrite) if rank == 0 else None
    with lock or nullcontext():
        return _record(w, request, rank, on_step)


def _record(w: Workload, request: RecordRequest, rank: int, on_step: Callable[[int, float], None] | None) -> RunSummary:
    """Train and trace into the claimed ``request.out``."""
    run = w.run
    if w.layout.world_size > 1:
        torch.distributed.barrier()  # no rank writes before rank 0 has cleared the directory
    extra = {"workload": request.workload, **node_header(request.fault_profile, request.fault_seed, request.abft)}
    run_info = RunInfo(request.node_label, config=w.config, seed=w.seed,
                       data_order_fingerprint=w.data_order_fingerprint, extra=extra)
    guard = default_guard(request.guard, abft=request.abft) if request.guard is not None else None
    tracer = Tracer(w.model, w.optimizer, out=request.out, run=run_info, options=request.trace, parallel=w.layout,
                    guard=guard)
    node = emulated_node(tracer, w.model, fault_profile=request.fault_profile, fault_seed=request.fault_seed,
                         abft=request.abft, sites=request.trace.sites)
    losses: list[float] = []
    start = time.perf_counter()
    every = run.checkpoint_every
    bar = tqdm(range(run.steps), desc=f"record {request.out.name}", unit="step", leave=False,
               disable=None if request.progress and rank == 0 else True)
    with tracer, node:
        for step in bar:
            if every and step % every == 0:
                tracer.checkpoint(step, data={"step": step}, states=w.states())
            with tracer.step(step):
                loss = run_step(w, step, tracer)
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}")
            if on_step is not None:
                on_step(step, loss)
        if every:
            tracer.checkpoint(run.steps, data={"step": run.steps}, states=w.states())
    if w.layout.world_size > 1:
        torch.distributed.barrier()  # rank 0 holds the writer lock until every rank has closed its log
    return RunSummary(request.out, run.steps, losses[-1], time.perf_counter() - start, losses)


def record_run(config: Config | Mapping[str, Any], out: str | Path, *, node_label: str,
               on_step: Callable[[int, float], None] | None = None, **options: Any) -> RunSummary:
    """`record` with the request's fields as keywords: the short form for scripts and tests."""
    return record(config, RecordRequest(out=Path(out), node_label=node_label, **options), on_step=on_step)

