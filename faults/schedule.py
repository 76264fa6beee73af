"""When a fault rule may fire: a step window, an optional step list, and bursts.

The study saw silent corruption arrive as sudden spikes, not at a steady rate, so
each rule carries a two-state Markov chain over optimizer steps: a healthy step
turns into a burst with probability ``p_enter``, a burst step stays one with
probability ``1 - p_exit``. The chain is drawn from its own seeded generator, step
after step from step 0, so whether step s is in a burst depends only on the seed
and s: the same in a full run, a resumed run and a one-step replay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tracer.typed_toml import check, require, toml_field

PROBABILITY = "a number in [0, 1]"


@dataclass(frozen=True)
class Schedule:
    """Which steps a rule is armed on; every condition must hold. Its keys sit in the rule's table."""

    p_enter: float = toml_field(1.0, expected=PROBABILITY)  # healthy -> burst, per step (1.0, p_exit 0.0: always)
    p_exit: float = toml_field(0.0, expected=PROBABILITY)  # burst -> healthy, per step
    start: int = toml_field(0, expected="an integer >= 0")  # first step of the window
    stop: int | None = toml_field(None, expected="an integer greater than start")  # first step after it (None: open)
    steps: tuple[int, ...] = toml_field((), expected="an array of integers >= 0")  # if not empty, only these steps

    def __post_init__(self) -> None:
        require(0 <= self.p_enter <= 1, "p_enter", self.p_enter, PROBABILITY)
        require(0 <= self.p_exit <= 1, "p_exit", self.p_exit, PROBABILITY)
        require(self.start >= 0, "start", self.start, "an integer >= 0")
        stop, start = self.stop, self.start
        check(
            stop is None or stop > start,
            "stop",
            lambda at: f"{at}stop = {stop} must be an integer greater than start = {start}",
        )
        require(all(s >= 0 for s in self.steps), "steps", self.steps, "an array of integers >= 0")
        object.__setattr__(self, "steps", tuple(sorted(set(self.steps))))


class BurstChain:
    """The per-step on/off state of one rule's schedule, deterministic from ``seed``."""

    def __init__(self, schedule: Schedule, seed: str) -> None:
        self.schedule = schedule
        self._rng = random.Random(seed)
        self._bursting: list[bool] = []

    def bursting(self, step: int) -> bool:
        s = self.schedule
        while len(self._bursting) <= step:
            was = self._bursting[-1] if self._bursting else False
            u = self._rng.random()
            self._bursting.append(u >= s.p_exit if was else u < s.p_enter)
        return self._bursting[step]

    def armed(self, step: int) -> bool:
        """True if the rule may fire on optimizer step ``step``."""
        s = self.schedule
        if step < s.start or (s.stop is not None and step >= s.stop):
            return False
        if s.steps and step not in s.steps:
            return False
        return self.bursting(step)
