"""The parallel layout of a multi-rank run: data-, tensor- and sequence-parallel sizes.

    layout = Layout(dp=2, tp=2, sp=True)       # 4 ranks
    layout.coords(3)                           # {"dp": 1, "tp": 1}

Ranks are numbered tensor-parallel first (Megatron's order): the ``tp`` ranks of one
tensor-parallel group are consecutive, so they sit on one node. Every rank's run
header records the layout and its own coordinates (``extra["parallel"]``); two runs
pair only if their layouts agree field by field (`tracer.pairing`), because a
different split of the same model sums in a different order and changes the bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracer.errors import CaptureError, ConfigError
from tracer.torch_internals import context_parallel_active

LAYOUT_FIELDS = ("dp", "tp", "sp")


@dataclass(frozen=True)
class Layout:
    dp: int = 1  # data-parallel replicas
    tp: int = 1  # tensor-parallel ranks per replica
    sp: bool = False  # sequence parallelism inside each tensor-parallel group

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's position: which replica (dp) and which shard within it (tp)."""
        return {"dp": rank // self.tp, "tp": rank % self.tp}

    def header(self, rank: int) -> dict[str, Any]:
        """What a run header's ``extra["parallel"]`` records."""
        return {"dp": self.dp, "tp": self.tp, "sp": self.sp, "coords": self.coords(rank)}

    def check(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise CaptureError(
                f"parallel layout dp={self.dp} x tp={self.tp} needs {self.world_size} ranks, but torch.distributed "
                f"has world size {world_size}; launch {self.world_size} ranks or change the layout"
            )


def layout_of(extra: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The layout a header records; logs without one were pure data-parallel (or single-rank)."""
    return extra.get("parallel") or {"dp": world_size, "tp": 1, "sp": False}


def refuse_context_parallel() -> None:
    """Raise `ConfigError` inside torch's ``context_parallel``: a site there sees this rank's part of the sequence,
    and replay, diff and the fault emulator know whole sequences only (docs/parallel.md, "Context parallelism")."""
    if context_parallel_active():
        raise ConfigError(
            "context parallelism: a traced site ran inside torch's context_parallel, which splits the sequence over "
            "the ranks; sdctrace traces whole sequences only (and on CPU torch 2.13's context_parallel has no "
            "sharding strategy for aten._scaled_dot_product_flash_attention_for_cpu: docs/parallel.md); "
            "trace the run without context_parallel"
        )
