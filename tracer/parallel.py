"""The parallel layout of a multi-rank run: data-, tensor-, sequence- and pipeline-parallel sizes.

    layout = Layout(dp=2, tp=2, sp=True)       # 4 ranks
    layout.coords(3)                           # {"dp": 1, "tp": 1}
    Layout(pp=2, pipeline=Pipeline("1F1B", microbatches=4)).coords(1)   # {"dp": 0, "tp": 0, "pp": 1}

Ranks are numbered tensor-parallel first (Megatron's order): the ``tp`` ranks of one
tensor-parallel group are consecutive, so they sit on one node; pipeline stages come last
(stage ``s`` holds ranks ``s * dp * tp`` to ``(s + 1) * dp * tp - 1``). Every rank's run
header records the layout and its own coordinates (``extra["parallel"]``); two runs
pair only if their layouts agree field by field (`tracer.pairing`), because a
different split of the same model sums in a different order and changes the bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracer.errors import CaptureError, ConfigError
from tracer.torch_internals import context_parallel_active

LAYOUT_FIELDS = ("dp", "tp", "sp", "pp", "pipeline")


@dataclass(frozen=True)
class Pipeline:
    """How a pipeline-parallel run feeds its stages (``torch.distributed.pipelining``)."""

    schedule: str  # the schedule's name: "GPipe", "1F1B", "Interleaved1F1B"
    microbatches: int  # the pipeline's microbatches per optimizer step (the log's microbatch index)
    stages_per_rank: int = 1  # > 1: an interleaved schedule, stage s on the ranks of position s % pp (loop style)
    # Each stage's modules by their whole-model names (stage s: stage_modules[s]), so that a record names its stage
    # where a rank holds several (the diff's ``stage``); given with stages_per_rank > 1
    stage_modules: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.microbatches < 1:
            raise CaptureError(f"pipeline microbatches = {self.microbatches}: a schedule needs at least 1")
        if self.stages_per_rank < 1:
            raise CaptureError(f"pipeline stages_per_rank = {self.stages_per_rank}: a rank holds at least 1 stage")
        if self.stage_modules and self.stages_per_rank == 1:
            raise CaptureError("pipeline stage_modules are for several stages per rank (stages_per_rank > 1) only")


@dataclass(frozen=True)
class Layout:
    dp: int = 1  # data-parallel replicas
    tp: int = 1  # tensor-parallel ranks per replica
    sp: bool = False  # sequence parallelism inside each tensor-parallel group
    pp: int = 1  # pipeline stages, each on dp x tp ranks of its own
    pipeline: Pipeline | None = None  # the schedule, given when pp > 1

    def __post_init__(self) -> None:
        if (self.pp > 1) != (self.pipeline is not None):
            raise CaptureError(
                f"parallel layout pp={self.pp} with pipeline={self.pipeline}: a pipeline of pp > 1 stages needs "
                "its schedule (Pipeline(schedule, microbatches)), and only it"
            )

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's position: which replica (dp), which shard within it (tp), which pipeline stage (pp)."""
        coords = {"dp": (rank // self.tp) % self.dp, "tp": rank % self.tp}
        return {**coords, "pp": rank // (self.dp * self.tp)} if self.pp > 1 else coords

    @property
    def stages(self) -> int:
        """Pipeline stages: ``pp`` positions times the stages each holds (interleaved schedules: several)."""
        return self.pp * (self.pipeline.stages_per_rank if self.pipeline is not None else 1)

    def stage_ranks(self) -> dict[str, list[int]]:
        """Each pipeline stage's ranks, by stage (JSON keys: strings): stage ``s`` at position ``s % pp``, as
        torch's loop-style interleaved schedules place it (one stage per position: ``s``)."""
        size = self.dp * self.tp
        return {str(s): list(range(s % self.pp * size, (s % self.pp + 1) * size)) for s in range(self.stages)}

    def header(self, rank: int) -> dict[str, Any]:
        """What a run header's ``extra["parallel"]`` records (``pp`` and ``pipeline`` only for a pipeline)."""
        out: dict[str, Any] = {"dp": self.dp, "tp": self.tp, "sp": self.sp, "coords": self.coords(rank)}
        if self.pipeline is not None:
            out["pp"] = self.pp
            out["pipeline"] = {
                "schedule": self.pipeline.schedule,
                "microbatches": self.pipeline.microbatches,
                "stage_ranks": self.stage_ranks(),
            }
            if self.pipeline.stages_per_rank > 1:  # absent for one stage per rank: such headers stay as they were
                out["pipeline"]["stages_per_rank"] = self.pipeline.stages_per_rank
                out["pipeline"]["stage_modules"] = {str(s): list(m) for s, m in enumerate(self.pipeline.stage_modules)}
        return out

    def check(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise CaptureError(
                f"parallel layout dp={self.dp} x tp={self.tp} x pp={self.pp} needs {self.world_size} ranks, but "
                f"torch.distributed has world size {world_size}; launch {self.world_size} ranks or change the layout"
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


def pipeline_of(extra: dict[str, Any]) -> dict[str, Any] | None:
    """A pipeline-parallel run's ``{"schedule", "microbatches", "stage_ranks"}`` from its header; None for others."""
    return (extra.get("parallel") or {}).get("pipeline")
