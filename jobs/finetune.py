"""The fine-tune job: fine-tune a pretrained run on the multiple-choice tasks, traced (RQ3's downstream damage).

    summary = finetune_run(Path("runs/golden"), Path("runs/golden-ft"), node_label="node-a")
    summary = finetune_run(pretrained, out, node_label="twin", settings=FinetuneSettings(shuffle_seed=1))
    sdc finetune --from runs/golden --out runs/golden-ft --node-label node-a

Starts from the pretrained run's final checkpoint (verified against its fingerprints)
and trains every weight to name the right letter (`workload.multiple_choice`). Every step is
traced like a pretraining step (fingerprints, `tracer.loss`, checkpoints), so `sdc diff`
of two fine-tunes gives event diffs, loss curves, loss spikes and parameter drift as for
pretraining. Every ``eval_every`` steps and at the end, the model answers each task's
test split: a ``finetune_eval`` event per task and a ``finetune_prediction`` event per
example (docs/finetune.md). Evaluation measures the weights: it is neither traced nor
exposed to an emulated fault.

The run header's config is the pretraining config plus a ``finetune`` section, so two
fine-tunes with the same settings pair, whatever node ran them; a shuffle-seed twin
(same settings, another ``shuffle_seed``) does not pair as a suspect, but is the
baseline `sdc diff --twin` compares suspects with (`tracer.pairing.twin_differences`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from faults import FaultProfile
from faults.node import emulated_node, node_header
from jobs.machine import check_resources
from tracer.checkpoint import Checkpoint, list_checkpoints, load_checkpoint
from tracer.determinism import configure_determinism
from tracer.errors import ConfigError, UsageError
from tracer.intercept import own_ops
from tracer.log import LogReader, RunHeader, claim_out_dir, rank_dir
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.model import Transformer
from workload.multiple_choice import (
    ROLE,
    ExampleBatches,
    FinetuneSettings,
    TaskEval,
    data_order_fingerprint,
    evaluate,
    letter_logits,
)
from workload.reference import make_optimizer
from workload.reference_config import Config, OptimConfig
from workload.tasks import Task, load_tasks


@dataclass
class FinetuneSummary:
    out: Path
    steps: int
    wall_s: float
    losses: list[float]
    final: list[TaskEval]  # the evaluation after the last step, one per task


def load_pretrained(run: Path) -> tuple[RunHeader, Config, Checkpoint]:
    """The pretraining run's header, config and verified final checkpoint (the state after its last step)."""
    header = LogReader(rank_dir(run, 0)).header
    if header.role == ROLE:
        raise UsageError(
            f"{run}: is a fine-tune (of run {header.extra.get('finetune_of')}); pass --from a "
            "pretraining run made by `sdc record`"
        )
    cfg = Config.from_dict(header.config, source=f"{run} (run header config)")
    have = list_checkpoints(run)
    if cfg.run.steps not in have:
        raise UsageError(
            f"{run}: no final checkpoint (step {cfg.run.steps}; checkpoints at steps {have or 'none'}); "
            "fine-tune a finished run recorded with run.checkpoint_every > 0"
        )
    return header, cfg, load_checkpoint(run, cfg.run.steps)


def finetune_run(
    pretrained: str | Path,
    out: str | Path,
    *,
    node_label: str,
    settings: FinetuneSettings = FinetuneSettings(),
    fault_profile: FaultProfile | None = None,
    fault_seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    run_id: str | None = None,
) -> FinetuneSummary:
    """Fine-tune `pretrained`'s final weights into run directory `out` (see the module docstring).

    `fault_profile` makes this node an emulated unhealthy one while it fine-tunes. `run_id`: the header's
    (None: a fresh random one).
    """
    pretrained, out, s = Path(pretrained), Path(out), settings
    source, cfg, ckpt = load_pretrained(pretrained)
    check_resources(
        {**cfg.to_dict(), "data": {"batch_size": s.batch_size, "seq_len": cfg.model.max_seq_len}},
        1,
        f"{pretrained} (fine-tuned with batch_size {s.batch_size})",
    )
    task_list = load_tasks(s.tasks, seed=s.task_seed, train=s.train_per_task, test=s.test_per_task)
    longest = max(len(ex.prompt) for t in task_list for ex in (*t.train, *t.test))
    if longest > cfg.model.max_seq_len:
        raise ConfigError(
            f"{pretrained}: model.max_seq_len = {cfg.model.max_seq_len} is shorter than the "
            f"longest task prompt ({longest} bytes); fine-tune a model with a longer max_seq_len"
        )
    with claim_out_dir(out, role=ROLE, overwrite=overwrite, inputs=(pretrained,)):
        configure_determinism(cfg.train.seed, cfg.train.threads)
        model = Transformer(cfg.model)
        model.load_state_dict(ckpt.model, strict=True)
        optim = s.optim()
        optimizer = make_optimizer(model, optim)
        train = ExampleBatches([ex for t in task_list for ex in t.train])
        config = {**cfg.to_dict(), "finetune": s.to_dict()}
        run = RunInfo(
            node_label,
            role=ROLE,
            config=config,
            run_id=run_id,
            # Like pretraining, everything but [run] (the pretraining length) decides the bits.
            seed=cfg.train.seed,
            data_order_fingerprint=data_order_fingerprint(s, task_list),
            extra={
                "finetune_of": source.run_id,
                "finetune": s.to_dict(),
                "tasks": {t.name: t.fingerprint for t in task_list},
                **node_header(fault_profile, fault_seed, False),
            },
        )
        tracer = Tracer(model, optimizer, out=out, run=run, **({} if progress else {"echo": None}))
        node = emulated_node(tracer, model, fault_profile=fault_profile, fault_seed=fault_seed)
        losses: list[float] = []
        start = time.perf_counter()
        bar = tqdm(
            range(s.steps), desc=f"finetune {out.name}", unit="step", disable=None if progress else True, leave=False
        )
        with tracer, node:
            for step in bar:
                if step % s.eval_every == 0:
                    _evaluate(tracer, model, task_list, step)
                if step % s.checkpoint_every == 0:
                    tracer.checkpoint(step, data={"step": step})
                with tracer.step(step):
                    losses.append(_train_step(tracer, model, optimizer, optim, train, s, step))
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
            final = _evaluate(tracer, model, task_list, s.steps)
            tracer.checkpoint(s.steps, data={"step": s.steps})
        return FinetuneSummary(out, s.steps, time.perf_counter() - start, losses, final)


def _train_step(
    tracer: Tracer,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    optim: OptimConfig,
    train: ExampleBatches,
    s: FinetuneSettings,
    step: int,
) -> float:
    for group in optimizer.param_groups:
        group["lr"] = optim.lr_at(step)
    optimizer.zero_grad(set_to_none=True)
    tokens, lengths, answers = train.batch(step, s.batch_size, s.shuffle_seed)
    tracer.microbatch(0, inputs=tokens)
    loss = F.cross_entropy(letter_logits(model, tokens, lengths), answers)
    loss.backward()
    tracer.loss(loss)
    if optim.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip, foreach=False)
    optimizer.step()
    return float(loss.detach())


def _evaluate(tracer: Tracer, model: torch.nn.Module, tasks: Sequence[Task], step: int) -> list[TaskEval]:
    """Answer every test example with the weights before `step` and log what was answered."""
    with tracer.paused(), own_ops():
        predictions = evaluate(model, tasks)
    results = []
    for task in tasks:
        predicted = predictions[task.name]
        for i, (p, ex) in enumerate(zip(predicted, task.test)):
            tracer.event("finetune_prediction", at_step=step, task=task.name, example=i, predicted=p, answer=ex.answer)
        r = TaskEval(task.name, len(task.test), sum(p == ex.answer for p, ex in zip(predicted, task.test)), task.chance)
        tracer.event(
            "finetune_eval",
            at_step=step,
            task=r.task,
            examples=r.examples,
            correct=r.correct,
            accuracy=r.accuracy,
            chance=r.chance,
            collapsed=r.collapsed,
        )
        results.append(r)
    return results
