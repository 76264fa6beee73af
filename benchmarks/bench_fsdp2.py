"""Tracing overhead of a 2-rank FSDP2 job, traced / untraced whole-run wall time.

    .venv/bin/python benchmarks/bench_fsdp2.py [RUNS [STEPS]]

Two gloo ranks (`jobs.launch`) train examples/torchrun_fsdp2.py's small transformer, ``fully_shard``-ed on each
block and on the root, for STEPS steps with AdamW and ``clip_grad_norm_``, as that example does: once untraced,
once traced as the example traces it (every site, gradient and parameter; each rank fingerprints its own DTensor
shards). RUNS runs of each variant after `timing.WARMUP` warm-up runs, in an order shuffled each time
(`timing.interleave`; both ranks draw the same order). A run's time is the whole job's: from a barrier before the
Tracer is made (its hooks, its I/O thread, the first step) to a barrier after it is closed (the log written and
flushed), so the slower rank counts and every one-time cost of a run is inside it; the model is built, and
sharded, before it, alike for both. Printed: the ratio of mean run times with its 95 % interval over the runs, and
what the warm-up runs took over steady ones. Both ranks share this machine's cores (one thread each).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from intervals import Ratio
from timing import Interleaved, interleave, machine_load
from torch import nn
from torch.distributed.fsdp import fully_shard

from jobs.launch import launch
from tracer.determinism import configure_determinism
from tracer.options import RunInfo
from tracer.tracing import Tracer

sys.path.append(str(Path(__file__).resolve().parents[1]))  # examples/ is not installed: the repository root
from examples.torchrun_fsdp2 import SETTINGS, Transformer  # noqa: E402

VOCAB, WIDTH, BLOCKS, BATCH, SEQ = 64, 32, 2, 4, 8  # the example's defaults
TARGET = 1.10


def sharded_model() -> nn.Module:
    """The example's model, seeded alike on every rank, ``fully_shard``-ed on each block and on the root."""
    configure_determinism(**SETTINGS)
    model = Transformer(VOCAB, WIDTH, BLOCKS)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def whole_run(steps: int, out: Path | None) -> Callable[[int], float]:
    """A variant for `interleave`: one whole run of ``steps`` steps on a fresh model, traced into ``out/run-N``
    (untraced where ``out`` is None); returns its wall time, barrier to barrier."""

    def run(index: int) -> float:
        model = sharded_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.Generator().manual_seed(1000 + dist.get_rank())  # each rank its own shard of the data
        dist.barrier()
        start = time.perf_counter()
        tracer = (
            None
            if out is None
            else Tracer(
                model, optimizer, out=out / f"run-{index}", run=RunInfo("bench-fsdp2", config=dict(SETTINGS)), echo=None
            )
        )
        with tracer or nullcontext():
            for step in range(steps):
                with tracer.step(step) if tracer else nullcontext():
                    train_step(model, optimizer, data, tracer)
        dist.barrier()
        return time.perf_counter() - start

    return run


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, data: torch.Generator, tracer: Tracer | None
) -> None:
    """examples/torchrun_fsdp2.py's step: next-token prediction on random tokens, clipped, AdamW."""
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=data)
    if tracer:
        tracer.microbatch(0, inputs=tokens)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if tracer:
        tracer.loss(loss)
        tracer.gradient_norm(norm)
    optimizer.step()
    optimizer.zero_grad()


def runs_side_by_side(runs: int, steps: int, out: str) -> dict[str, Any]:
    """One rank: ``runs`` untraced and traced runs after the warm-up runs, interleaved; each run's seconds."""
    # The head's output is a view; the loss reads it, nothing writes it in place (torch warns on every rank).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    timed = interleave({"untraced": whole_run(steps, None), "traced": whole_run(steps, Path(out))}, runs)
    return {
        "seconds": {n: list(t) for n, t in timed.seconds.items()},
        "warmup": {n: list(t) for n, t in timed.warmup.items()},
    }


def bench_fsdp2(runs: int = 14, steps: int = 20) -> Ratio:
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        results = launch("bench_fsdp2:runs_side_by_side", {"runs": runs, "steps": steps, "out": tmp}, 2)
    r = results[0]  # after a barrier: the job's time
    timed = Interleaved({n: tuple(t) for n, t in r["seconds"].items()}, {n: tuple(t) for n, t in r["warmup"].items()})
    print(
        f"2-rank FSDP2       : traced/untraced whole runs of {steps} steps = "
        f"{timed.describe('traced', 'untraced', TARGET, item='run')}"
    )
    return timed.ratio("traced", "untraced")


if __name__ == "__main__":
    print(machine_load(), flush=True)
    bench_fsdp2(*(int(a) for a in sys.argv[1:3]))
