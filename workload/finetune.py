"""Fine-tune a pretrained run on the multiple-choice tasks, traced: RQ3's downstream damage.

    summary = finetune_run(Path("runs/golden"), Path("runs/golden-ft"), node_label="node-a")
    sdc finetune --from runs/golden --out runs/golden-ft --node-label node-a

Starts from the pretrained run's final checkpoint (verified against its fingerprints)
and trains every weight to name the right letter: next-token cross-entropy at the
byte after "Answer: ", over the four choice letters only. Every step is traced like a
pretraining step (fingerprints, `tracer.loss`, checkpoints), so `sdc diff` of two
fine-tunes gives event diffs, loss curves, loss spikes and parameter drift as for
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

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from faults import FaultProfile
from faults.node import emulated_node, node_header
from tracer.checkpoint import Checkpoint, list_checkpoints, load_checkpoint
from tracer.determinism import configure_determinism
from tracer.errors import ConfigError, UsageError
from tracer.intercept import own_ops
from tracer.log import LogReader, RunHeader, claim_out_dir, rank_dir
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.config import Config, OptimConfig
from workload.model import Transformer
from workload.reference import make_optimizer
from workload.tasks import LADDER, LETTERS, TASK_NAMES, Example, Task, load_tasks

ROLE = "finetune"
ORDER_ALGORITHM = "mcqa-examples/torch-randperm-per-epoch/sha256-seed/v1"
LETTER_TOKENS = torch.tensor(list(LETTERS.encode("ascii")))  # (CHOICES,) byte ids of A..D
EVAL_BATCH = 256


@dataclass(frozen=True)
class FinetuneSettings:
    """Everything that decides a fine-tune's bits; all of it is the header config's ``finetune`` section."""

    steps: int = 200
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50  # steps between evaluations (and one before the first step and after the last)
    checkpoint_every: int = 100  # steps between checkpoints (and one after the last)
    train_per_task: int = 512
    test_per_task: int = 128
    task_seed: int = 0  # generates the tasks' examples
    shuffle_seed: int = 0  # order of the training examples only: a twin differs here alone
    tasks: tuple[str, ...] = LADDER

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "checkpoint_every", "train_per_task", "test_per_task"):
            if getattr(self, name) < 1:
                raise ConfigError(f"fine-tune {name} = {getattr(self, name)} must be >= 1")
        for name in ("task_seed", "shuffle_seed", "warmup_steps", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ConfigError(f"fine-tune {name} = {getattr(self, name)} must be >= 0")
        if self.lr <= 0:
            raise ConfigError(f"fine-tune lr = {self.lr} must be > 0")
        unknown = [t for t in self.tasks if t not in TASK_NAMES]
        if unknown or not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"fine-tune tasks {','.join(self.tasks) or '(none)'}: name each once, from "
                              f"{', '.join(TASK_NAMES)}")

    def optim(self) -> OptimConfig:
        """AdamW with linear warmup, then cosine decay to lr / 10 at the last step."""
        return OptimConfig(lr=self.lr, warmup_steps=self.warmup_steps, weight_decay=self.weight_decay,
                           grad_clip=self.grad_clip, schedule_steps=max(self.steps, self.warmup_steps + 1),
                           min_lr=self.lr / 10)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


@dataclass(frozen=True)
class TaskEval:
    """One task's accuracy at one evaluation."""

    task: str
    examples: int
    correct: int
    chance: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.examples

    @property
    def collapsed(self) -> bool:
        return collapsed(self.accuracy, self.chance, self.examples)


@dataclass
class FinetuneSummary:
    out: Path
    steps: int
    wall_s: float
    losses: list[float]
    final: list[TaskEval]  # the evaluation after the last step, one per task


def collapsed(accuracy: float, chance: float, examples: int) -> bool:
    """No better than guessing: accuracy at most chance plus two standard errors of a guesser's accuracy
    on `examples` questions (so a random guesser is flagged about 98 % of the time). Near-zero accuracy
    lies below that bound too."""
    return accuracy <= chance + 2.0 * math.sqrt(chance * (1.0 - chance) / examples)


def load_pretrained(run: Path) -> tuple[RunHeader, Config, Checkpoint]:
    """The pretraining run's header, config and verified final checkpoint (the state after its last step)."""
    header = LogReader(rank_dir(run, 0)).header
    if header.role == ROLE:
        raise UsageError(f"{run}: is a fine-tune (of run {header.extra.get('finetune_of')}); pass --from a "
                         "pretraining run made by `sdc record`")
    cfg = Config.from_dict(header.config, source=f"{run} (run header config)")
    have = list_checkpoints(run)
    if cfg.run.steps not in have:
        raise UsageError(f"{run}: no final checkpoint (step {cfg.run.steps}; checkpoints at steps {have or 'none'}); "
                         "fine-tune a finished run recorded with run.checkpoint_every > 0")
    return header, cfg, load_checkpoint(run, cfg.run.steps)


class ExampleBatches:
    """Examples as padded byte tensors; training batches in a per-epoch order seeded by the shuffle seed.

    Prompts are right-padded with zeros: under causal attention the padding never reaches a prompt's own
    positions, so an example's answer does not depend on the batch it is in.
    """

    def __init__(self, examples: Sequence[Example]) -> None:
        self.lengths = torch.tensor([len(ex.prompt) for ex in examples])  # (N,)
        self.tokens = torch.zeros(len(examples), int(self.lengths.max()), dtype=torch.long)  # (N, Tmax)
        for i, ex in enumerate(examples):
            self.tokens[i, : len(ex.prompt)] = torch.tensor(list(ex.prompt.encode("ascii")))
        self.answers = torch.tensor([ex.answer for ex in examples])  # (N,)
        self._orders: dict[tuple[int, int], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.answers)

    def take(self, index: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens (B, T) cut to the longest prompt, lengths (B,), answers (B,))."""
        lengths = self.lengths[index]
        return self.tokens[index, : int(lengths.max())].contiguous(), lengths, self.answers[index]

    def batch(self, step: int, batch_size: int, shuffle_seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training batch `step`: the next `batch_size` examples of the epochs' permutations."""
        first = step * batch_size
        picks = [self._order(shuffle_seed, epoch)[i] for epoch, i in
                 (divmod(n, len(self)) for n in range(first, first + batch_size))]
        return self.take(torch.stack(picks))

    def _order(self, shuffle_seed: int, epoch: int) -> torch.Tensor:
        if (shuffle_seed, epoch) not in self._orders:
            # Hash (seed, epoch) rather than add them, so seed s+1 is not seed s shifted by an epoch.
            digest = hashlib.sha256(f"finetune/{shuffle_seed}/{epoch}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
            self._orders = {k: v for k, v in self._orders.items() if k[1] == epoch - 1}
            self._orders[shuffle_seed, epoch] = torch.randperm(len(self), generator=generator)
        return self._orders[shuffle_seed, epoch]


def letter_logits(model: torch.nn.Module, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, CHOICES) logits of the choice letters as the byte after each prompt."""
    logits = model(tokens)  # (B, T, V)
    last = logits[torch.arange(len(tokens)), lengths - 1]  # (B, V)
    return last[:, LETTER_TOKENS.to(last.device)].float()  # (B, CHOICES)


def evaluate(model: torch.nn.Module, tasks: Sequence[Task]) -> dict[str, list[int]]:
    """Each task's predicted answer index per test example."""
    device = next(model.parameters()).device
    predictions = {}
    with torch.no_grad():
        for task in tasks:
            data = ExampleBatches(task.test)
            out: list[int] = []
            for lo in range(0, len(data), EVAL_BATCH):
                tokens, lengths, _ = data.take(slice(lo, lo + EVAL_BATCH))
                out += letter_logits(model, tokens.to(device), lengths.to(device)).argmax(-1).tolist()
            predictions[task.name] = out
    return predictions


def data_order_fingerprint(settings: FinetuneSettings, tasks: Sequence[Task]) -> str:
    order = {"algorithm": ORDER_ALGORITHM, "tasks": {t.name: t.fingerprint for t in tasks},
             "batch_size": settings.batch_size, "shuffle_seed": settings.shuffle_seed}
    return hashlib.sha256(json.dumps(order, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def finetune_run(
    pretrained: str | Path,
    out: str | Path,
    *,
    node_label: str,
    shuffle_seed: int | None = None,
    steps: int | None = None,
    tasks: Sequence[str] | None = None,
    fault_profile: FaultProfile | None = None,
    fault_seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    settings: FinetuneSettings | None = None,
) -> FinetuneSummary:
    """Fine-tune `pretrained`'s final weights into run directory `out` (see the module docstring).

    `settings` defaults to `FinetuneSettings()`; `shuffle_seed`, `steps` and `tasks` override it.
    `fault_profile` makes this node an emulated unhealthy one while it fine-tunes.
    """
    pretrained, out = Path(pretrained), Path(out)
    overrides = {"shuffle_seed": shuffle_seed, "steps": steps, "tasks": tuple(tasks) if tasks is not None else None}
    s = dataclasses.replace(settings or FinetuneSettings(), **{k: v for k, v in overrides.items() if v is not None})
    source, cfg, ckpt = load_pretrained(pretrained)
    task_list = load_tasks(s.tasks, seed=s.task_seed, train=s.train_per_task, test=s.test_per_task)
    longest = max(len(ex.prompt) for t in task_list for ex in (*t.train, *t.test))
    if longest > cfg.model.max_seq_len:
        raise ConfigError(f"{pretrained}: model.max_seq_len = {cfg.model.max_seq_len} is shorter than the "
                          f"longest task prompt ({longest} bytes); fine-tune a model with a longer max_seq_len")
    with claim_out_dir(out, role=ROLE, overwrite=overwrite, inputs=(pretrained,)):
        configure_determinism(cfg.train.seed, cfg.train.threads)
        model = Transformer(cfg.model)
        model.load_state_dict(ckpt.model, strict=True)
        optim = s.optim()
        optimizer = make_optimizer(model, optim)
        train = ExampleBatches([ex for t in task_list for ex in t.train])
        config = {**cfg.to_dict(), "finetune": s.to_dict()}
        run = RunInfo(
            node_label, role=ROLE, config=config,
            # Like pretraining, everything but [run] (the pretraining length) decides the bits.
            seed=cfg.train.seed, data_order_fingerprint=data_order_fingerprint(s, task_list),
            extra={"finetune_of": source.run_id, "finetune": s.to_dict(),
                   "tasks": {t.name: t.fingerprint for t in task_list},
                   **node_header(fault_profile, fault_seed, False)},
        )
        tracer = Tracer(model, optimizer, out=out, run=run, **({} if progress else {"echo": None}))
        node = emulated_node(tracer, model, fault_profile=fault_profile, fault_seed=fault_seed)
        losses: list[float] = []
        start = time.perf_counter()
        bar = tqdm(range(s.steps), desc=f"finetune {out.name}", unit="step", disable=None if progress else True,
                   leave=False)
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


def _train_step(tracer: Tracer, model: torch.nn.Module, optimizer: torch.optim.Optimizer, optim: OptimConfig,
                train: ExampleBatches, s: FinetuneSettings, step: int) -> float:
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
        tracer.event("finetune_eval", at_step=step, task=r.task, examples=r.examples, correct=r.correct,
                     accuracy=r.accuracy, chance=r.chance, collapsed=r.collapsed)
        results.append(r)
    return results
