"""Framework strategies on 2 gloo ranks under torchrun, traced by sdctrace's callbacks: what
test_sharded_strategies.py launches (docs/parallel.md, "Framework strategies")::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.integrations.sharded_tiny \
        --strategy lightning-model-parallel --out runs/mp

``--strategy``:

- ``lightning-model-parallel``: Lightning's `ModelParallelStrategy` (data parallel 2, tensor parallel 1), whose
  ``configure_model`` applies FSDP2's ``fully_shard`` to each block and the root of lightning_tiny's model;
- ``hf-fsdp``: hf_tiny's Llama under ``transformers.Trainer`` with ``fsdp=True`` and ``fsdp_version`` 2 in
  ``fsdp_config``. On CPU accelerate keeps no FSDP plugin and trains data-parallel (``MULTI_CPU``); the header's
  ``extra.accelerate.distributed_type`` records which it did.

Three steps, two microbatches a step but the epoch's last (each rank holds five of the ten sequences).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tracer.determinism import configure_determinism
from tracer.options import TraceOptions

# Each rank imports only its strategy's framework: Lightning's import alone is ~3 s of CPU, transformers' Trainer
# ~2.5 s, and the test launches 10 ranks.

STEPS, CHECKPOINT_EVERY = 3, 2
STRATEGIES = ("lightning-model-parallel", "hf-fsdp")


def record_model_parallel(out: Path) -> None:
    """Fit lightning_tiny's model with ModelParallelStrategy, ``fully_shard`` on each block, then the root, traced
    into ``out``."""
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    from tests.integrations import lightning_tiny
    from tracer.integrations import lightning

    class ShardedLM(lightning_tiny.TinyLM):
        def configure_model(self) -> None:
            mesh = self.device_mesh["data_parallel"]
            for block in self.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self, mesh=mesh)

    configure_determinism(lightning_tiny.SEED, threads=1)
    cb = lightning.SdcTraceCallback(
        out,
        "node",
        seed=lightning_tiny.SEED,
        options=TraceOptions(sites=lightning_tiny.SITES),
        checkpoint_every=CHECKPOINT_EVERY,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=STEPS,
        accumulate_grad_batches=2,
        deterministic=True,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(out.with_name(out.name + "-lightning")),
        callbacks=[cb],
    )
    trainer.fit(ShardedLM())


def record_hf_fsdp(out: Path) -> None:
    """Train hf_tiny's Llama with FSDP2 asked of accelerate, traced into ``out``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from tests.integrations import hf_tiny
    from tracer.integrations import hf

    configure_determinism(hf_tiny.SEED, threads=1)
    args = TrainingArguments(
        output_dir=str(out.with_name(out.name + "-hf")),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=STEPS,
        learning_rate=1e-3,
        warmup_steps=0,
        max_grad_norm=1.0,
        save_strategy="steps",
        save_steps=CHECKPOINT_EVERY,
        save_only_model=True,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=hf_tiny.SEED,
        disable_tqdm=True,
        fsdp=True,
        fsdp_config={"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
    )
    trainer = Trainer(model=LlamaForCausalLM(LlamaConfig(**hf_tiny.MODEL)), args=args, train_dataset=hf_tiny.dataset())
    state = trainer.accelerator.state
    cb = hf.SdcTraceCallback(
        out,
        "node",
        options=TraceOptions(sites=hf_tiny.SITES),
        extra={
            "accelerate": {
                "distributed_type": state.distributed_type.value,
                "fsdp_plugin": getattr(state, "fsdp_plugin", None) is not None,
            }
        },
    )
    trainer.add_callback(cb)
    with cb:
        trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description="Record a tiny model under a framework's multi-rank strategy.")
    parser.add_argument("--strategy", required=True, choices=STRATEGIES, help="the framework and its strategy")
    parser.add_argument("--out", type=Path, required=True, help="the run directory (one rank-NNNNN log per rank)")
    args = parser.parse_args()
    (record_hf_fsdp if args.strategy == "hf-fsdp" else record_model_parallel)(args.out)


if __name__ == "__main__":
    main()
