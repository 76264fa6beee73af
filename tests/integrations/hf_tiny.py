"""A tiny ``LlamaForCausalLM`` trained by ``transformers.Trainer``: the run the HF end-to-end tests record, and
its replay factory (``--workload tests.integrations.hf_tiny:build``).

Ten sequences in batches of two are five batches an epoch; two batches a step makes steps 0 and 1 of an
epoch two microbatches each and step 2 the epoch's last batch alone, so a fault at step 2 names its
microbatch. Five steps cross into the second epoch; checkpoints at steps 0, 2, 4 and 5.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from tracer.determinism import configure_determinism
from tracer.integrations.hf import SdcTraceCallback
from tracer.options import CapturePolicy, TraceOptions
from workload.hf import TrainerWorkload

SEED = 0
# The variants a test's own config section ``variant`` selects (the header keeps it): ``bf16`` trains under
# accelerate's bf16 autocast, ``bert`` is a BERT with its default dropout (0.1) in training mode.
BERT = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 32,
}
BERT_SITES = r"bert\.encoder\.layer\.\d+\.(attention|output)"
MODEL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}
SITES = None  # the defaults: every layer's self_attn (called with keyword arguments, tuple output) and mlp
SITE_COUNT = 4
STEPS, SAVE_STEPS = 5, 2
FAULT_STEP, FAULT_SITE = 2, "model.layers.1.mlp"  # step 2 has one microbatch
WORKLOAD = "tests.integrations.hf_tiny:build"


def dataset() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, MODEL["vocab_size"], (10, 16), generator=torch.Generator().manual_seed(1234))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def make_trainer(
    output_dir: Path,
    callbacks: Sequence[TrainerCallback] = (),
    *,
    loss_kwargs: bool = True,
    bf16: bool = False,
    bert: bool = False,
    steps: int = STEPS,
    save_steps: int = SAVE_STEPS,
) -> Trainer:
    """The Trainer; ``loss_kwargs=False`` makes it treat the model as one that takes no ``num_items_in_batch``,
    so it divides each microbatch's mean loss by the step's microbatches instead. ``steps`` and ``save_steps``:
    its ``max_steps`` and ``save_steps``."""
    configure_determinism(SEED, threads=1)
    model = BertForMaskedLM(BertConfig(**BERT)) if bert else LlamaForCausalLM(LlamaConfig(**MODEL))
    args = TrainingArguments(
        bf16=bf16,
        output_dir=str(output_dir),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=steps,
        learning_rate=1e-3,
        warmup_steps=0,
        max_grad_norm=1.0,
        save_strategy="steps",
        save_steps=save_steps,
        save_only_model=True,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=SEED,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset(), callbacks=list(callbacks))
    trainer.model_accepts_loss_kwargs = loss_kwargs
    return trainer


def record(out: Path, label: str, capture: CapturePolicy = CapturePolicy(), **callback: Any) -> Path:
    """Train with the callback into ``out``; the Trainer's own output directory is a sibling. A ``config``
    with a ``variant`` section trains that variant."""
    options = variant(callback.get("config", {}))
    sites = BERT_SITES if options["bert"] else SITES
    cb = SdcTraceCallback(out, label, options=TraceOptions(sites=sites, capture=capture), **callback)
    trainer = make_trainer(out.with_name(out.name + "-hf"), [cb], **options)
    with cb:
        trainer.train()
    return out


def build(config: Mapping[str, Any], device: torch.device) -> TrainerWorkload:
    """The replay factory: the same Trainer, never trained (its output directory stays unwritten)."""
    return TrainerWorkload.of(make_trainer(Path(tempfile.gettempdir()) / "sdctrace-hf-replay", **variant(config)))


def variant(config: Mapping[str, Any]) -> dict[str, Any]:
    """The test's own config section, which the header keeps: ``variant.loss_kwargs`` (default true), ``bf16``
    and ``bert`` (default false), ``steps`` and ``save_steps`` (default `STEPS`, `SAVE_STEPS`), as
    `make_trainer`'s keywords."""
    section = config.get("variant", {})
    return {
        "loss_kwargs": bool(section.get("loss_kwargs", True)),
        "bf16": bool(section.get("bf16", False)),
        "bert": bool(section.get("bert", False)),
        "steps": int(section.get("steps", STEPS)),
        "save_steps": int(section.get("save_steps", SAVE_STEPS)),
    }
