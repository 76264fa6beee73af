"""The batches of optimizer step k, for a training loop that runs epochs over a data loader.

Framework trainers iterate their data loader epoch after epoch and group consecutive batches into optimizer
steps (gradient accumulation); the last group of an epoch takes what is left. Replay asks for the batches of
any step after restoring a checkpoint, and then for the steps after it in order: `EpochBatches` walks the
loader the trainer's way, keeping its place so that consecutive steps cost one group each.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tracer.errors import ValidationError


@dataclass
class EpochBatches:
    """Step ``k``'s batches: ``per_step`` consecutive batches of an epoch of ``batches_per_epoch``.

    ``open_epoch(e)`` returns epoch ``e``'s iterator the way the trainer opens it (setting the sampler's
    epoch). With ``history``, epoch ``e``'s order depends on the epochs before it (a loader drawing from its
    own generator), so reaching epoch ``e`` from elsewhere opens epochs ``0 .. e-1`` first, and
    ``open_epoch(0)`` must start from a fresh loader.
    """

    open_epoch: Callable[[int], Iterator[Any]]
    batches_per_epoch: int
    per_step: int
    history: bool = False
    _epoch: int = field(default=-1, init=False)
    _next: int = field(default=0, init=False)  # the next step within the open epoch
    _iterator: Iterator[Any] | None = field(default=None, init=False)

    @property
    def steps_per_epoch(self) -> int:
        return max(math.ceil(self.batches_per_epoch / self.per_step), 1)

    def step(self, step: int) -> list[Any]:
        epoch, index = divmod(step, self.steps_per_epoch)
        # Drawing batches must leave the training's RNG as it was: only the loader's own state moves.
        with torch.random.fork_rng(devices=[]):
            if (epoch, index) != (self._epoch, self._next):
                self._seek(epoch, index)
            assert self._iterator is not None
            # Exactly the step's batches: reading past an epoch's last batch would end its sampler, which can
            # draw from the loader's generator again (RandomSampler does), and trainers stop at the length.
            count = min(self.per_step, self.batches_per_epoch - index * self.per_step)
            batches = list(itertools.islice(self._iterator, count))
        if len(batches) < count:
            raise ValidationError(
                f"the data loader has {len(batches)} of the {count} batches of step {step} "
                f"(epoch {epoch}, step {index} of "
                f"{self.steps_per_epoch}): it yields fewer than the {self.batches_per_epoch} "
                "batches its length promises"
            )
        self._next = index + 1
        return batches

    def _seek(self, epoch: int, index: int) -> None:
        following = epoch == self._epoch + 1 and index == 0 and self._next == self.steps_per_epoch
        if self.history and not following:
            for earlier in range(epoch):
                collections.deque(itertools.islice(self.open_epoch(earlier), self.batches_per_epoch), maxlen=0)
        self._iterator = self.open_epoch(epoch)
        collections.deque(itertools.islice(self._iterator, index * self.per_step), maxlen=0)
        self._epoch, self._next = epoch, index
