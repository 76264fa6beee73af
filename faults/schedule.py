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


@dataclass(frozen=True)
class Schedule:
    """Which steps a rule is armed on; every condition must hold."""

    p_enter: float = 1.0  # healthy -> burst, per step (1.0 with p_exit 0.0: always armed)
    p_exit: float = 0.0  # burst -> healthy, per step
    start: int = 0  # first step of the window
    stop: int | None = None  # first step after the window (None: open-ended)
    steps: tuple[int, ...] = ()  # if not empty, only these steps


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
