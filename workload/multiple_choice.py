"""Fine-tuning on the multiple-choice tasks: its settings, batches and evaluation (RQ3's downstream damage).

    settings = FinetuneSettings(steps=50, tasks=("copy", "find"))
    logits = letter_logits(model, tokens, lengths)          # (B, CHOICES)
    predictions = evaluate(model, load_tasks(settings.tasks))

The fine-tune job (`jobs.finetune`, ``sdc finetune``) trains every weight to name the
right letter: next-token cross-entropy at the byte after "Answer: ", over the four
choice letters only, on `ExampleBatches` in a per-epoch order seeded by
``shuffle_seed``. `FinetuneSettings` is everything that decides a fine-tune's bits,
the header config's ``finetune`` section; a study file's ``[finetune]`` table builds
one too. `evaluate` answers each task's test split; `collapsed` says whether an
accuracy is no better than chance (docs/finetune.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracer.log.records import MAX_STEP
from tracer.typed_toml import check
from workload.reference_config import MAX_SEED, OptimConfig
from workload.tasks import LADDER, LETTERS, TASK_NAMES, Example, Task

ROLE = "finetune"
ORDER_ALGORITHM = "mcqa-examples/torch-randperm-per-epoch/sha256-seed/v1"
LETTER_TOKENS = torch.tensor(list(LETTERS.encode("ascii")))  # (CHOICES,) byte ids of A..D
EVAL_BATCH = 256
MAX_EXAMPLES = 1 << 20  # train or test examples per task: each is generated and held in memory


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
        # The keys are relative to this dataclass, so a study file's [finetune] table names its own (typed_toml).
        def at_or_finetune(at: str) -> str:
            return at or "fine-tune "

        for name, low in (
            *(
                (n, 1)
                for n in ("steps", "batch_size", "eval_every", "checkpoint_every", "train_per_task", "test_per_task")
            ),
            *((n, 0) for n in ("task_seed", "shuffle_seed", "warmup_steps", "weight_decay", "grad_clip")),
        ):
            value = getattr(self, name)
            check(
                value >= low, name, lambda at, n=name, v=value, lo=low: f"{at_or_finetune(at)}{n} = {v} must be >= {lo}"
            )
        for name, top in (
            ("steps", MAX_STEP),
            ("warmup_steps", MAX_STEP),
            ("eval_every", MAX_STEP),
            ("checkpoint_every", MAX_STEP),
            ("train_per_task", MAX_EXAMPLES),
            ("test_per_task", MAX_EXAMPLES),
            ("task_seed", MAX_SEED),
            ("shuffle_seed", MAX_SEED),
        ):
            value = getattr(self, name)
            check(
                value <= top, name, lambda at, n=name, v=value, t=top: f"{at_or_finetune(at)}{n} = {v} must be <= {t}"
            )
        for name in ("lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            check(
                math.isfinite(value),
                name,
                lambda at, n=name, v=value: f"{at_or_finetune(at)}{n} = {v} must be a finite number",
            )
        check(self.lr > 0, "lr", lambda at: f"{at_or_finetune(at)}lr = {self.lr} must be > 0")
        unknown = [t for t in self.tasks if t not in TASK_NAMES]
        check(
            not unknown and bool(self.tasks) and len(set(self.tasks)) == len(self.tasks),
            "tasks",
            lambda at: (
                f"{at_or_finetune(at)}tasks {','.join(self.tasks) or '(none)'}: name each once, from "
                f"{', '.join(TASK_NAMES)}"
            ),
        )

    def optim(self) -> OptimConfig:
        """AdamW with linear warmup, then cosine decay to lr / 10 at the last step."""
        return OptimConfig(
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            schedule_steps=max(self.steps, self.warmup_steps + 1),
            min_lr=self.lr / 10,
        )

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


def collapsed(accuracy: float, chance: float, examples: int) -> bool:
    """No better than guessing: accuracy at most chance plus two standard errors of a guesser's accuracy
    on `examples` questions (so a random guesser is flagged about 98 % of the time). Near-zero accuracy
    lies below that bound too."""
    return accuracy <= chance + 2.0 * math.sqrt(chance * (1.0 - chance) / examples)


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
        picks = [
            self._order(shuffle_seed, epoch)[i]
            for epoch, i in (divmod(n, len(self)) for n in range(first, first + batch_size))
        ]
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
    order = {
        "algorithm": ORDER_ALGORITHM,
        "tasks": {t.name: t.fingerprint for t in tasks},
        "batch_size": settings.batch_size,
        "shuffle_seed": settings.shuffle_seed,
    }
    return hashlib.sha256(json.dumps(order, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
