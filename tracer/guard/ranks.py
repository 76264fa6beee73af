"""The guard's collectives: what every rank of a multi-rank run decides together, so that all of them re-run,
skip or stop the same step and none waits alone in a collective.

    ranks = GuardRanks.of(world_size)        # world_size 1 (or no torch.distributed): every call is local
    alarm, cannot_rerun = ranks.any_of(bool(alarms), rerun is None)   # one all-reduce (MAX) of two flags
    again = ranks.any_of(outcome is None)[0]                            # a re-run while any rank is undecided
    outcome = ranks.worst(outcome)                                      # the most severe rank's outcome

Each call is one all-reduce of a few int64 on the process group's device (CPU under gloo, the current CUDA
device under NCCL), marked as sdctrace's own op so the fault emulator never touches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from tracer.intercept import own_ops

Outcome = Literal["transient", "deterministic", "unresolved", "unclassified"]  # what the guard found a step to be
# In the order a collective decision takes the most severe: a step is transient only if it is on every rank.
OUTCOMES: tuple[Outcome, ...] = ("transient", "deterministic", "unresolved", "unclassified")


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a collective of ``group`` takes its tensors: the current CUDA device under NCCL, else the CPU."""
    if "nccl" in str(dist.get_backend(group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class GuardRanks:
    """The ranks that decide each guarded step together (``world_size`` 1: a single process decides alone)."""

    world_size: int

    @staticmethod
    def of(world_size: int) -> GuardRanks:
        return GuardRanks(world_size if world_size > 1 and dist.is_available() and dist.is_initialized() else 1)

    def any_of(self, *flags: bool) -> tuple[bool, ...]:
        """Per flag: whether it is set on any rank."""
        if self.world_size == 1:
            return tuple(bool(f) for f in flags)
        return tuple(bool(v) for v in self._max([int(bool(f)) for f in flags]))

    def worst(self, outcome: Outcome) -> Outcome:
        """The most severe of the ranks' outcomes (`OUTCOMES` order)."""
        if self.world_size == 1:
            return outcome
        return OUTCOMES[self._max([OUTCOMES.index(outcome)])[0]]

    def _max(self, values: list[int]) -> list[int]:
        with own_ops():
            t = torch.tensor(values, dtype=torch.int64, device=group_device())
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.tolist()
