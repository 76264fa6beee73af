"""The reference workload's step memory, read from a header's config without building it (`jobs.machine` bounds
it by this machine): the parameter count is the built model's, and configs without the reference's keys are not
sized."""

from __future__ import annotations

from workload.model import Transformer
from workload.reference_config import load_config
from workload.reference_memory import STATE_BYTES, StepMemory


def test_the_parameter_count_is_the_built_models() -> None:
    config = load_config("tiny", ["model.n_layers=3", "model.ffn_hidden=96", "model.n_kv_heads=1"])
    need = StepMemory.of(config.to_dict())
    assert need is not None
    built = sum(p.numel() for p in Transformer(config.model).parameters())
    assert need.parameters == config.model.parameters == built


def test_a_step_counts_weights_and_state_and_one_ranks_microbatch() -> None:
    config = load_config("tiny").to_dict()
    one = StepMemory.of(config)
    config["parallel"]["dp"] = 2
    config["model"]["dtype"] = "bfloat16"
    halved = StepMemory.of(config)
    assert one is not None and halved is not None
    assert (one.dp, one.dtype_bytes, halved.dp, halved.dtype_bytes) == (1, 4, 2, 2)
    tokens = one.batch_size * one.seq_len
    logits = tokens * one.vocab_size * 4 * 2
    activations = tokens * one.n_layers * (4 * one.dim + 3 * one.ffn_hidden) * 4
    assert one.bytes == one.parameters * (4 + STATE_BYTES) + activations + logits
    assert halved.bytes == one.parameters * (2 + STATE_BYTES) + activations // 4 + logits // 2
    assert "data.batch_size = 8 sequences of data.seq_len = 64 tokens" in one.describe()


def test_another_workloads_config_is_not_sized() -> None:
    config = load_config("tiny").to_dict()
    assert StepMemory.of({"model": {"name": "gpt2"}}) is None
    assert StepMemory.of({**config, "data": {"batch_size": 8}}) is None
    assert StepMemory.of({**config, "model": {**config["model"], "dim": 128.0}}) is None
    assert StepMemory.of({**config, "model": {**config["model"], "n_heads": 0}}) is None
