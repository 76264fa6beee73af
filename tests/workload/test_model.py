"""The LLaMA-style model: shapes, module paths, GQA, rotary embeddings, causality."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workload.model import Transformer, apply_rotary, rotary_tables
from workload.reference_config import ModelConfig, load_config, shipped_configs


def built(cfg: ModelConfig, seed: int = 0) -> Transformer:
    model = Transformer(cfg)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_each_shipped_config_builds_and_runs(name):
    cfg = load_config(name).model
    model = built(cfg)
    B, T = (1, 8) if cfg.n_layers > 16 else (2, 16)
    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (B, T, cfg.vocab_size)
    assert torch.isfinite(logits).all()
    modules = dict(model.named_modules())
    for i in range(cfg.n_layers):
        assert f"layers.{i}.attention" in modules and f"layers.{i}.feed_forward" in modules


def test_gqa_has_fewer_kv_heads():
    cfg = load_config("llama3-16l-mini").model
    attention = Transformer(cfg).layers[0].attention
    assert attention.wq.weight.shape == (cfg.n_heads * cfg.head_dim, cfg.dim)
    assert attention.wk.weight.shape == (cfg.n_kv_heads * cfg.head_dim, cfg.dim)
    assert attention.wv.weight.shape == (cfg.n_kv_heads * cfg.head_dim, cfg.dim)
    assert cfg.n_kv_heads < cfg.n_heads


def test_rotary_scores_depend_only_on_relative_position():
    D = 32
    cos, sin = rotary_tables(D, 64, 10000.0)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, D, generator=gen), torch.randn(1, 1, 1, D, generator=gen)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rotary(q, cos[m : m + 1], sin[m : m + 1])
        kn = apply_rotary(k, cos[n : n + 1], sin[n : n + 1])
        return (qm * kn).sum()

    for m, n, shift in [(5, 2, 7), (0, 0, 30), (10, 3, 40)]:
        torch.testing.assert_close(score(m, n), score(m + shift, n + shift), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 3), atol=1e-3)  # the angle matters
    # Rotation preserves each vector's norm.
    torch.testing.assert_close(apply_rotary(q, cos[9:10], sin[9:10]).norm(), q.norm())


def test_rotary_tables_are_not_saved():
    model = Transformer(load_config("tiny").model)
    assert not any("rope" in key for key in model.state_dict())


def test_causal():
    cfg = load_config("tiny").model
    model = built(cfg)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    t = 20
    changed = tokens.clone()
    changed[:, t] = (changed[:, t] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :t], after[:, :t])
    assert not torch.equal(before[:, t:], after[:, t:])


def test_bfloat16_parameters_and_forward():
    cfg = dataclasses.replace(load_config("tiny").model, dtype="bfloat16")
    model = built(cfg)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        logits = model(torch.zeros(1, 8, dtype=torch.long))
    assert logits.dtype == torch.bfloat16 and logits.shape == (1, 8, 256)


def test_sequence_longer_than_tables_is_refused():
    cfg = load_config("tiny").model
    with pytest.raises(AssertionError, match=f"> max_seq_len {cfg.max_seq_len}"):
        Transformer(cfg)(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))
