"""What each rank of the HF-LLaMA-under-FSDP2 test runs (``jobs.launch``): a model sdctrace did not design,
built from its config, sharded with ``fully_shard`` per decoder layer, trained under a Tracer."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from faults.node import emulated_node, node_header
from faults.profile import load_profile
from tracer.determinism import configure_determinism
from tracer.options import RunInfo
from tracer.tracing import Tracer

CONFIG = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16,
}


def train_llama(out: str, steps: int, profile_path: str = "") -> None:
    rank = dist.get_rank()
    configure_determinism(seed=0, threads=1)  # the same initial weights on every rank
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    profile = load_profile(profile_path) if profile_path else None
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    run = RunInfo(f"rank{rank}", config={"llama": CONFIG}, extra=node_header(profile, 0, False))
    tracer = Tracer(model, optimizer, out=out, run=run, echo=None)
    with tracer, emulated_node(tracer, model, fault_profile=profile, fault_seed=0):
        for step in range(steps):
            with tracer.step(step):
                tokens = torch.randint(CONFIG["vocab_size"], (2, 9), generator=data)
                tracer.microbatch(0, inputs=tokens)
                loss = model(input_ids=tokens, labels=tokens).loss
                loss.backward()
                tracer.loss(loss)
                optimizer.step()
                optimizer.zero_grad()
