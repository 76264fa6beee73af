"""A pipeline-parallel job (``torch.distributed.pipelining``: GPipe or 1F1B, or an interleaved schedule) traced stage
by stage: each rank holds one stage of the model (or several) and traces it with its own Tracer, and the same module
is the workload factory ``build`` that ``sdc record --nproc N`` runs.

From the repository root (``--workload`` imports ``examples.torchrun_pipeline`` from there)::

    sdc record --workload examples.torchrun_pipeline:build --nproc 2 --out runs/pp
    sdc record --workload examples.torchrun_pipeline:build --nproc 2 --out runs/pp-sick \\
        --fault-profile my-rank1-fault.toml             # an emulated unhealthy node: a rule's ``ranks`` picks it
    sdc record --workload examples.torchrun_pipeline:build --nproc 4 --set parallel.schedule=GPipe --out runs/pp4
    sdc record --workload examples.torchrun_pipeline:build --nproc 2 --set parallel.schedule=Interleaved1F1B \\
        --set parallel.stages_per_rank=2 --out runs/pp-interleaved   # 4 stages, stages 0 and 2 on rank 0
    sdc diff --golden runs/pp --suspect runs/pp-sick --db pp.duckdb && sdc query summary --db pp.duckdb
    sdc replay --golden runs/pp --suspect runs/pp-sick --workload examples.torchrun_pipeline:build --nproc 2 \\
        --steps 3:4 --mode lockstep --out runs/pp-lockstep
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m examples.torchrun_pipeline --out runs/pp

examples/torchrun_fsdp2.py's small transformer (embedding, blocks of attention and an ``mlp``, a head), one block
per stage by default, split into as many stages as ranks: stage ``s`` runs on rank ``s`` (`Stage`: the embedding on
the first stage, the head on the last). Each stage keeps the unsplit model's module names (``blocks.1.mlp`` on
stage 1, not ``blocks.0.mlp``), so sites and parameters are named as in the whole model. Every rank draws the same
batch; the schedule splits it into ``train.microbatches`` pipeline microbatches, and the log's microbatch is the
pipeline's: the Tracer is told each chunk's index before the stage runs its forward or its backward (`TracedStage`),
in the schedule's order (1F1B interleaves them; `tracer.pipeline`). The header's ``extra["parallel"]`` records
``pp``, the schedule, its microbatches and the stage-to-rank map (`tracer.parallel.Layout`).

With ``parallel.stages_per_rank`` = k > 1 (an interleaved schedule: ``Interleaved1F1B``, ``LoopedBFS`` or
``InterleavedZeroBubble``) the model is split into k stages per rank, stage ``s`` on rank ``s % ranks`` (torch's
loop style): a rank's stages run as separate `TracedStage` s and are traced, stepped and checkpointed together as
one module (`RankStages`) under the whole model's names; the header adds ``stages_per_rank`` and each stage's
modules (``stage_modules``), so the diff names the stage of a record.

What crosses ranks is recorded as collective events (`tracer.pipeline`), fingerprinted at the stage's edge:
``pipeline.0-1.send.in`` (forward, on rank 0) is the activation stage 0 sends to stage 1, ``pipeline.0-1.recv.out``
(forward, on rank 1) what stage 1 received; ``pipeline.1-0.send.in`` and ``pipeline.1-0.recv.out`` (backward) are
the gradient going back. A stage that only received a corrupted tensor first differs at its ``recv``, after the
stage that computed it. No gradient clipping (a global norm would need the stages' norms all-reduced). Every
``run.checkpoint_every`` steps (2) each stage saves its own checkpoint, which ``sdc replay --workload
examples.torchrun_pipeline:build --nproc N`` restores stage by stage (docs/parallel.md). Only the last stage
computes the loss; each step's is broadcast to every stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
)

from examples.torchrun_fsdp2 import (
    SETTINGS,
    RandomTokensLM,
    Transformer,
    job_arguments,
    job_config,
    record,
    with_defaults,
)
from tracer import Layout, Pipeline, SdcError, configure_determinism
from tracer.pipeline import TracedStage, received, sent
from workload import StepObserver

SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}  # one stage per rank
# Several stages per rank (``parallel.stages_per_rank``), stage s on rank s % ranks (torch's loop style)
# (V-style schedules, ZBVZeroBubble and DualPipeV, place stages otherwise: not offered)
INTERLEAVED = {
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "LoopedBFS": ScheduleLoopedBFS,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
}


def defaults(stages: int) -> dict[str, dict[str, Any]]:
    """The example's config on ``stages`` ranks: one block per stage."""
    return {
        "model": {"vocab": 64, "width": 32, "blocks": stages},
        "train": {**SETTINGS, "lr": 1e-2, "batch": 2, "seq": 8, "microbatches": 4, "clip": 0.0},
        "parallel": {"schedule": "1F1B"},
        "run": {"steps": 6, "checkpoint_every": 2},
    }


class Stage(nn.Module):
    """Stage ``index`` of ``stages`` of ``model``: its share of the blocks under their global names (a ModuleDict
    keyed by the block's index in the whole model), the embedding on the first stage, the head on the last."""

    def __init__(self, model: Transformer, index: int, stages: int) -> None:
        super().__init__()
        n = len(model.blocks)
        if n < stages:
            raise SdcError(f"model.blocks = {n}: cannot fill {stages} pipeline stages; give at least one per stage")
        self.index, self.stages = index, stages
        self.embed = model.embed if index == 0 else None
        self.blocks = nn.ModuleDict(
            {str(b): model.blocks[b] for b in range(index * n // stages, (index + 1) * n // stages)}
        )
        self.head = model.head if index == stages - 1 else None

    def module_names(self) -> tuple[str, ...]:
        """The stage's modules by their whole-model names: ``("embed", "blocks.0")``."""
        blocks = tuple(f"blocks.{k}" for k in self.blocks)
        return ("embed",) * (self.embed is not None) + blocks + ("head",) * (self.head is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x) if self.embed is not None else received(x, self.index)  # (B, T, C)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else sent(x, self.index)  # (B, T, V) or (B, T, C)


class RankStages(nn.Module):
    """The stages one rank holds under an interleaved schedule, as one module under the whole model's names
    (``blocks.0`` and ``blocks.2`` on rank 0 of 2 ranks x 2 stages): what the Tracer hooks, the optimizer steps
    and a checkpoint saves. Each stage runs its own `Stage` (the same submodules); this module never runs."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        super().__init__()
        self.embed = next((s.embed for s in stages if s.embed is not None), None)
        self.blocks = nn.ModuleDict({k: b for s in stages for k, b in s.blocks.items()})
        self.head = next((s.head for s in stages if s.head is not None), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise SdcError("RankStages holds several pipeline stages; each runs in its own PipelineStage")


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@dataclass
class PipelineLM(RandomTokensLM):
    """`RandomTokensLM` on this rank's pipeline stages (one, or several under an interleaved schedule): the
    schedule runs the step's microbatches (unsplit on one rank). Every stage draws the same batch: the layout has
    one data-parallel replica."""

    stages: list[TracedStage] = field(default_factory=list)
    schedule: Any = None  # a torch.distributed.pipelining schedule over ``stages``
    last_loss: float = 0.0  # the last step's loss, which only the last stage computes, on every stage

    def loss(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        return next_token_loss(self.model(batch[:, :-1]), batch[:, 1:]) / self.config["train"]["microbatches"]

    def run_microbatches(self, step: int, observer: StepObserver | None = None) -> list[torch.Tensor]:
        if not self.stages:
            return super().run_microbatches(step, observer)
        batch = torch.cat(list(self.microbatches(step)))  # (M * B, T + 1): the schedule splits it again
        losses: list[torch.Tensor] = []
        inputs = (batch[:, :-1],) if any(s.is_first for s in self.stages) else ()
        targets = {"target": batch[:, 1:], "losses": losses} if any(s.is_last for s in self.stages) else {}
        for stage in self.stages:
            stage.observer = observer
        try:
            self.schedule.step(*inputs, **targets)
        finally:
            for stage in self.stages:
                stage.observer = None
        scaled = [loss.detach() / len(losses) for loss in losses]  # as each contributes to the step
        total = torch.stack(scaled).sum() if scaled else torch.zeros(())
        first = self.stages[0]
        last = first.stage_index_to_group_rank[first.num_stages - 1]
        dist.broadcast(total, group=first.group, group_src=last)  # untraced: no stage's own tensor
        self.last_loss = float(total)
        if observer is not None:
            for index, loss in enumerate(scaled):
                observer.microbatch(index)
                observer.loss(loss)
        return scaled

    def step_loss(self, losses: Sequence[float]) -> float:
        """The step's loss on every stage (`sdc record` reports rank 0's)."""
        return self.last_loss if self.stages else super().step_loss(losses)


def traced_stage(stage: Stage, config: Mapping[str, Any], device: torch.device) -> TracedStage:
    """``stage`` as torch's pipelining runs it, given one microbatch's shapes so that it infers nothing (a traced
    forward on meta tensors); an activation that requires grad is one whose gradient goes back."""
    b, s, c, v = config["train"]["batch"], config["train"]["seq"], config["model"]["width"], config["model"]["vocab"]
    i, n = stage.index, stage.stages
    inputs = torch.zeros(b, s, dtype=torch.long) if i == 0 else torch.zeros(b, s, c, requires_grad=True)
    outputs = torch.zeros(b, s, v if i == n - 1 else c, requires_grad=True)
    return TracedStage(stage, i, n, device, input_args=inputs, output_args=outputs)


def pipeline_layout(config: Mapping[str, Any], ranks: int) -> tuple[str, int]:
    """``parallel.schedule`` and ``parallel.stages_per_rank`` (1 unless given), checked against each other."""
    schedule, per_rank = config["parallel"]["schedule"], config["parallel"].get("stages_per_rank", 1)
    if schedule not in SCHEDULES and schedule not in INTERLEAVED:
        raise SdcError(f"parallel.schedule = {schedule!r}: expected one of {sorted(SCHEDULES) + sorted(INTERLEAVED)}")
    if not isinstance(per_rank, int) or per_rank < 1:
        raise SdcError(f"parallel.stages_per_rank = {per_rank!r}: expected an int >= 1")
    if per_rank > 1 and schedule not in INTERLEAVED:
        raise SdcError(
            f"parallel.stages_per_rank = {per_rank} with parallel.schedule = {schedule!r}: several stages per rank "
            f"need an interleaved schedule, one of {sorted(INTERLEAVED)}"
        )
    return schedule, per_rank


def build(config: Mapping[str, Any], device: torch.device) -> PipelineLM:
    """The workload factory (`workload.protocol`): the model split into ``parallel.stages_per_rank`` stages per
    rank (1: one stage per rank), this rank's stages under the schedule ``parallel.schedule`` (GPipe or 1F1B; with
    several stages per rank one of `INTERLEAVED`, stage s on rank s % ranks); the whole model without a process
    group."""
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    per_rank = config.get("parallel", {}).get("stages_per_rank", 1)
    config = with_defaults(config, defaults(ranks * per_rank if isinstance(per_rank, int) else ranks))
    m, t = config["model"], config["train"]
    schedule, per_rank = pipeline_layout(config, ranks)
    stages = ranks * per_rank if dist.is_initialized() else 1
    configure_determinism(t["seed"], t["threads"])  # the same initial weights on every rank, before the split
    model = Transformer(m["vocab"], m["width"], m["blocks"]).to(device)
    split = [Stage(model, index, stages) for index in range(stages)]
    held = split[rank::ranks]  # loop style: stage s on rank s % ranks
    module = held[0] if len(held) == 1 else RankStages(held)
    names = tuple(s.module_names() for s in split) if per_rank > 1 else ()
    pipeline = Pipeline(schedule, t["microbatches"], per_rank, names)
    layout = Layout(pp=ranks, pipeline=pipeline) if stages > 1 else Layout()
    w = PipelineLM(
        model=module,
        optimizer=torch.optim.AdamW(module.parameters(), lr=t["lr"], foreach=False),
        config=config,
        seed=t["seed"],
        layout=layout,
        data_order_fingerprint=f"random-tokens/seed={t['seed']}/replicas=1",
    )
    if stages > 1:
        w.stages = [traced_stage(stage, config, device) for stage in held]
        if schedule in INTERLEAVED:
            w.schedule = INTERLEAVED[schedule](w.stages, t["microbatches"], loss_fn=next_token_loss)
        else:
            w.schedule = SCHEDULES[schedule](w.stages[0], t["microbatches"], loss_fn=next_token_loss)
    return w


def main() -> None:
    p = job_arguments(__doc__)
    p.add_argument("--schedule", choices=sorted(SCHEDULES) + sorted(INTERLEAVED), default="1F1B")
    p.add_argument("--stages-per-rank", type=int, default=1, help="several: an interleaved --schedule")
    args = p.parse_args()
    dist.init_process_group("gloo")
    try:
        parallel = {"schedule": args.schedule, **({"stages_per_rank": n} if (n := args.stages_per_rank) > 1 else {})}
        config = job_config(args, parallel=parallel)
        record(build(config, torch.device("cpu")), args, entry="examples.torchrun_pipeline:build")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
