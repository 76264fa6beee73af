"""Trace a Hugging Face ``Trainer`` run with sdctrace, then diff and replay it: a runnable example.

A tiny GPT-2 (random init: 2 layers, width 32) learns token sequences generated from a seed: 6 optimizer steps
of two accumulated microbatches, on the CPU, in seconds. From the repository root, with it on the import path
(``export PYTHONPATH=.``, so that replay can import ``examples.hf_trainer``)::

    python examples/hf_trainer.py --out runs/hf-golden --node-label node-a
    python examples/hf_trainer.py --out runs/hf-sick --node-label node-b --fault-profile bursty-mismatch --fault-seed 1

    sdc diff --golden runs/hf-golden --suspect runs/hf-sick --db study.duckdb
    sdc query summary --db study.duckdb
    sdc replay --golden runs/hf-golden --suspect runs/hf-sick --workload examples.hf_trainer:build \\
        --at-first-divergence --mode lockstep --out runs/hf-lockstep
    sdc replay --golden runs/hf-golden --suspect runs/hf-sick --workload examples.hf_trainer:build \\
        --steps 2:4 --mode param-sync --out runs/hf-param-sync

Recording is the Trainer's own ``train()`` with `SdcTraceCallback` among its callbacks. Replay cannot call
``train()`` (it runs single steps from a checkpoint), so it imports ``build``, which makes the same Trainer
(same seed, model config, TrainingArguments and data) and wraps it in `TrainerWorkload`: the Trainer's own
dataloader, loss, clipping, optimizer and scheduler, step by step; GPT-2's dropout replays too (the Tracer logs
the torch RNG at each step's start). docs/integrations.md says what else makes a run replayable.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from faults import load_profile, node_options
from tracer import configure_determinism
from tracer.integrations.hf import SdcTraceCallback
from workload.hf import TrainerWorkload

SEED = 0
# GPT-2's default dropout (0.1) stays on. A dict, not a config object: saving a checkpoint writes into the model's
# config, and the run header records it.
MODEL = {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4}


def dataset(n: int = 24, length: int = 16) -> list[dict[str, torch.Tensor]]:
    """Counting sequences with a random start and stride: something a tiny model can learn."""
    g = torch.Generator().manual_seed(1)
    start, stride = torch.randint(0, 64, (n, 1), generator=g), torch.randint(1, 4, (n, 1), generator=g)
    ids = (start + stride * torch.arange(length)) % 64  # (n, length)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def make_trainer(output_dir: str | Path, callbacks: Sequence[TrainerCallback] = ()) -> Trainer:
    configure_determinism(SEED, threads=1)  # bits depend on the thread count; the header records it
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=6,
        learning_rate=3e-3,
        max_grad_norm=1.0,
        save_strategy="steps",
        save_steps=2,
        save_only_model=True,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=SEED,
        disable_tqdm=True,
    )
    model = GPT2LMHeadModel(GPT2Config(**MODEL))
    return Trainer(model=model, args=args, train_dataset=dataset(), callbacks=list(callbacks))


def build(config: Mapping[str, Any], device: torch.device) -> TrainerWorkload:
    """The factory ``sdc replay --workload examples.hf_trainer:build`` calls: the same Trainer, untrained."""
    return TrainerWorkload.of(make_trainer(Path(tempfile.gettempdir()) / "sdctrace-example-hf"))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="run directory to record into")
    p.add_argument("--node-label", default="node-a", help="this node's name in the run header")
    p.add_argument("--fault-profile", help="play an unhealthy node with this fault profile (sdc faults list)")
    p.add_argument("--fault-seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    args = p.parse_args(argv)
    node = node_options(load_profile(args.fault_profile), args.fault_seed) if args.fault_profile else {}
    callback = SdcTraceCallback(args.out, args.node_label, overwrite=args.overwrite, **node)  # default sites
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as trainer_dir, callback:
        make_trainer(trainer_dir, [callback]).train()
    print(f"recorded {args.out}; next: sdc inspect {args.out}")


if __name__ == "__main__":
    main()
