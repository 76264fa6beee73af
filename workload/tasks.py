"""Multiple-choice QA tasks for fine-tuning, generated from a seed (no downloads).

    tasks = load_tasks(["copy", "exclude"], seed=0, train=512, test=128)
    tasks[0].test[0].prompt   # 'The answer is C.\\nA) k B) q C) w D) m\\nAnswer: '
    tasks[0].test[0].answer   # 2: the model should write the letter "C" next

Every prompt is ASCII (byte-level tokens), at most `MAX_PROMPT` bytes, and ends with
"Answer: ", so the next byte is one of the choice letters. Tasks, easiest first for
the tiny reference model. The default `LADDER` is graded so that a tiny model fine-tuned for
200 steps lands between chance and 100 % on most rungs (measured in docs/finetune.md):

- ``copy``: the answer letter is written at a fixed place in the question; copy it.
- ``find``: the same, but at a random place in random letters holding other capitals too.
- ``exclude``: the question names the three wrong letters; answer the fourth.
- ``longest``: which of four random words is longest.
- ``match``: which option equals a given letter (find it, name its position).

Outside the ladder, for a fine-tune that asks for them by name:

- ``max``: which of four two-digit numbers is largest.
- ``add``: the sum of two digits, among close distractors.
- ``sequence``: the next term of an arithmetic progression, among close distractors.

Answers are balanced (example i of a split has answer i mod 4), so always naming
the same letter scores exactly chance. Train and test hold no prompt in common.
A task's `fingerprint` is a SHA-256 of everything it is made of: the same name,
seed and sizes give the same examples on every machine, and if the generator ever
changes, so does the fingerprint, and old and new fine-tunes no longer pair.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from tracer.errors import ConfigError

LETTERS = "ABCD"
CHOICES = len(LETTERS)
MAX_PROMPT = 64  # bytes; the tiny model's data.seq_len
GENERATOR_VERSION = "sdctrace-mcqa/v2"  # change it whenever any generator changes

Question = tuple[str, str, list[str]]  # (question text, correct option, three distractors)


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: int  # index into LETTERS


@dataclass(frozen=True)
class Task:
    name: str
    seed: int
    train: tuple[Example, ...]
    test: tuple[Example, ...]

    @property
    def chance(self) -> float:
        """Accuracy of guessing (and of always naming one letter, as answers are balanced)."""
        return 1.0 / CHOICES

    @cached_property
    def fingerprint(self) -> str:
        h = hashlib.sha256(f"{GENERATOR_VERSION}\0{self.name}\0{self.seed}".encode())
        for split in (self.train, self.test):
            h.update(f"\0{len(split)}".encode())
            for ex in split:
                h.update(f"\0{ex.prompt}\0{ex.answer}".encode())
        return h.hexdigest()


ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def _letters(rng: random.Random, k: int) -> list[str]:
    return rng.sample(ALPHABET, k)


def _noise(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET + " ") for _ in range(n))


def _copy(rng: random.Random, answer: int) -> Question:
    options = _letters(rng, 4)
    return f"The answer is {LETTERS[answer]}.", options[0], options[1:]


def _find(rng: random.Random, answer: int) -> Question:
    # One or two capital letters in the noise, mostly before the statement: the model must find
    # "answer is", not the nearest capital. At most 10 + 14 + 3 bytes: prompts no longer than other tasks'.
    before, after = list(_noise(rng, rng.randrange(2, 11))), list(_noise(rng, rng.randrange(4)))
    for _ in range(rng.randrange(1, 3)):
        side = before if not after or rng.random() < 0.8 else after
        side[rng.randrange(len(side))] = rng.choice(LETTERS)
    options = _letters(rng, 4)
    return f"{''.join(before)} answer is {LETTERS[answer]}. {''.join(after)}".strip(), options[0], options[1:]


def _exclude(rng: random.Random, answer: int) -> Question:
    wrong = [letter for letter in LETTERS if letter != LETTERS[answer]]
    rng.shuffle(wrong)
    options = _letters(rng, 4)
    return f"Not {wrong[0]}, {wrong[1]} or {wrong[2]}.", options[0], options[1:]


def _longest(rng: random.Random, answer: int) -> Question:
    lengths = sorted(rng.sample(range(1, 7), 4), reverse=True)
    words = ["".join(rng.choice(ALPHABET) for _ in range(n)) for n in lengths]
    return "Longest word?", words[0], words[1:]


def _match(rng: random.Random, answer: int) -> Question:
    options = _letters(rng, 4)
    return f"Which is {options[0]}?", options[0], options[1:]


def _max(rng: random.Random, answer: int) -> Question:
    numbers = sorted(rng.sample(range(10, 100), 4), reverse=True)
    return "Which is largest?", str(numbers[0]), [str(n) for n in numbers[1:]]


def _add(rng: random.Random, answer: int) -> Question:
    a, b = rng.randrange(10), rng.randrange(10)
    total = a + b
    near = [n for n in range(total - 4, total + 5) if n >= 0 and n != total]
    return f"What is {a}+{b}?", str(total), [str(n) for n in rng.sample(near, 3)]


def _sequence(rng: random.Random, answer: int) -> Question:
    step = rng.randrange(2, 10)
    start = rng.randrange(1, 40)
    terms = [start + i * step for i in range(4)]
    nxt = terms[-1] + step
    near = [n for n in range(nxt - 5, nxt + 6) if n != nxt]
    return f"Next: {' '.join(map(str, terms))}", str(nxt), [str(n) for n in rng.sample(near, 3)]


GENERATORS: dict[str, Callable[[random.Random, int], Question]] = {
    "copy": _copy,
    "find": _find,
    "exclude": _exclude,
    "longest": _longest,
    "match": _match,
    "max": _max,
    "add": _add,
    "sequence": _sequence,
}
TASK_NAMES = tuple(GENERATORS)
LADDER = ("copy", "find", "exclude", "longest", "match")  # the default tasks, easiest first


def render(question: str, options: Sequence[str]) -> str:
    listed = " ".join(f"{letter}) {option}" for letter, option in zip(LETTERS, options))
    return f"{question}\n{listed}\nAnswer: "


def make_task(name: str, *, seed: int, train: int, test: int) -> Task:
    """Generate `test` then `train` distinct prompts of task `name` from `seed`."""
    if name not in GENERATORS:
        raise ConfigError(f"unknown task {name!r}; choose from {', '.join(TASK_NAMES)}")
    if train < 1 or test < 1:
        raise ConfigError(f"task {name}: need at least one train and one test example, got train={train}, test={test}")
    # A string seed is hashed (SHA-512) by `random`: the same stream on every Python 3.
    rng = random.Random(f"{GENERATOR_VERSION}/{name}/{seed}")
    seen: set[str] = set()
    splits: list[list[Example]] = [[], []]
    attempts = 0
    for split, size in zip(splits, (test, train)):
        while len(split) < size:
            attempts += 1
            if attempts > 50 * (train + test):
                raise ConfigError(f"task {name}: cannot find {train + test} distinct prompts; ask for fewer examples")
            answer = len(split) % CHOICES
            question, correct, distractors = GENERATORS[name](rng, answer)
            options = list(distractors)
            rng.shuffle(options)
            options.insert(answer, correct)
            prompt = render(question, options)
            assert len(prompt) <= MAX_PROMPT, f"task {name}: prompt of {len(prompt)} bytes: {prompt!r}"
            if prompt not in seen:
                seen.add(prompt)
                split.append(Example(prompt, answer))
    return Task(name, seed, train=tuple(splits[1]), test=tuple(splits[0]))


def load_tasks(names: Sequence[str] | None = None, *, seed: int = 0, train: int = 512, test: int = 128) -> list[Task]:
    """The named tasks (default: the `LADDER`, easiest first), each with its train and test split."""
    chosen = list(names) if names is not None else list(LADDER)
    if not chosen:
        raise ConfigError(f"no tasks chosen; choose from {', '.join(TASK_NAMES)}")
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"tasks {', '.join(chosen)}: each task may appear once")
    return [make_task(n, seed=seed, train=train, test=test) for n in chosen]
