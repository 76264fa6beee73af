"""Guarded recordings of the small reference workload, with the guard and the emulated node the test chooses."""

from __future__ import annotations

from pathlib import Path

from faults import FaultProfile, load_profile
from faults.node import emulated_node
from tests.support import small_config
from tracer.guard import Guard
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, Phase, TensorRecord
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build

# One logit of the LM head's output, first microbatch, at step {step}, stuck at 1e4: the loss jumps by ~80.
STUCK_LOGIT = """
seed = 5
[[fault]]
ops = ["matmul"]
sites = "output"
phases = ["forward"]
steps = [{step}]
microbatches = [0]
p_call = {p_call}
elements = 1
kind = "stuck"
value = 10000.0
persistent = {persistent}
"""


def stuck_logit(
    tmp: Path, step: int, *, persistent: bool, p_call: float = 1.0, attempts: list[int] | None = None
) -> FaultProfile:
    """``attempts``: the runs of the step it fires in (the first only: ``[0]``); None, every run."""
    kind = "persistent" if persistent else "transient"
    path = tmp / f"stuck-{step}-{kind}-{p_call}-{'_'.join(map(str, attempts or []))}.toml"
    text = STUCK_LOGIT.format(step=step, p_call=p_call, persistent=str(persistent).lower())
    if attempts is not None:
        text += f"attempts = {attempts}\n"
    path.write_text(text, encoding="utf-8")
    return load_profile(path)


def record_guarded(
    out: Path, guard: Guard | None, steps: int, profile: FaultProfile | None = None, fault_seed: int = 0
) -> list[float]:
    """What `jobs.record` does, with any guard: train ``steps`` steps (a checkpoint before the first)."""
    w = build(small_config(f"run.steps={steps}", "run.checkpoint_every=0"))
    run = RunInfo(out.name, config=w.config, seed=w.seed, data_order_fingerprint=w.data_order_fingerprint)
    tracer = Tracer(w.model, w.optimizer, out=out, run=run, guard=guard)
    losses = []
    with tracer, emulated_node(tracer, w.model, fault_profile=profile, fault_seed=fault_seed):
        tracer.checkpoint(0, data={"step": 0}, states=w.states())
        for step in range(steps):
            with tracer.step(step):
                losses.append(run_step(w, step, tracer))
    return losses


def records(run: Path) -> list[TensorRecord | EventRecord]:
    return list(LogReader(rank_dir(run, 0)).records())


def trained(run: Path) -> list[tuple]:
    """What training did, in log order: every tensor record, and every loss."""
    return [
        (r.step, r.microbatch, r.name, r.phase, r.fingerprint)
        if isinstance(r, TensorRecord)
        else (r.step, r.fields["microbatch"], r.fields["loss"])
        for r in records(run)
        if isinstance(r, TensorRecord) or r.kind == "loss"
    ]


def params(run: Path, step: int) -> dict[str, int]:
    return {
        r.name: r.fingerprint
        for r in records(run)
        if isinstance(r, TensorRecord) and r.phase == Phase.PARAM and r.step == step
    }


def kinds(run: Path, kind: str) -> list[EventRecord]:
    return [r for r in records(run) if isinstance(r, EventRecord) and r.kind == kind]
