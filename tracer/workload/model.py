"""A LLaMA-style decoder: the model the reference workload trains.

    model = Transformer(load_config("tiny").model)
    model.init_weights(torch.Generator().manual_seed(seed))
    logits = model(tokens)  # (B, T) int64 -> (B, T, vocab_size)

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU
feed-forward, in pre-norm residual blocks. Module paths are part of the contract:
the tracer finds its sites at `layers.{i}.attention` and `layers.{i}.feed_forward`,
and each of those takes one tensor and returns one, so a replay can swap in golden
inputs. Rotary embeddings use real arithmetic (no complex tensors) so that XLA can
compile them, and attention goes through `F.scaled_dot_product_attention`, the op
the fault emulator intercepts.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tracer.workload.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32: a bfloat16 mean of squares loses too much precision.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, ...]:
    """cos and sin of angle position * theta^(-2i/head_dim), each (max_seq_len, head_dim / 2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (T, D/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of every head by its position's angle."""
    B, T, H, D = x.shape
    assert cos.shape == (T, D // 2), f"rotary table {tuple(cos.shape)} does not fit {tuple(x.shape)}"
    pairs = x.float().reshape(B, T, H, D // 2, 2)  # (B, T, H, D/2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]  # (B, T, H, D/2)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, D/2)
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, T, H, D/2, 2)
    return rotated.flatten(3).type_as(x)  # (B, T, H, D)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False, dtype=dtype)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False, dtype=dtype)
        # Derived from the config, so not saved: a checkpoint holds only learned state.
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.wq(x).view(B, T, H, D)  # (B, T, H, D)
        k = self.wk(x).view(B, T, KV, D)  # (B, T, KV, D)
        v = self.wv(x).view(B, T, KV, D)  # (B, T, KV, D)
        q = apply_rotary(q, self.rope_cos[:T], self.rope_sin[:T])
        k = apply_rotary(k, self.rope_cos[:T], self.rope_sin[:T])
        # Each kv head serves H / KV query heads. expand+reshape (not repeat_interleave)
        # keeps the backward a plain sum, deterministic on every device.
        k = k[:, :, :, None, :].expand(B, T, KV, H // KV, D).reshape(B, T, H, D)  # (B, T, H, D)
        v = v[:, :, :, None, :].expand(B, T, KV, H // KV, D).reshape(B, T, H, D)  # (B, T, H, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)
        return self.wo(y)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False, dtype=dtype)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, C)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, dtype)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, dtype)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))  # (B, T, C)
        return x + self.feed_forward(self.ffn_norm(x))  # (B, T, C)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, dtype=dtype)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, dtype)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, dtype=dtype)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Reproducible init: every weight drawn from one CPU generator in parameter order.

        Drawing in float32 on the CPU and copying makes the initial bits the same on
        every device, so runs on different hardware start from the same point.
        Residual output projections (wo, w2) are scaled by 1/sqrt(2 * n_layers), as in
        GPT-2, so the residual stream does not grow with depth.
        """
        assert generator.device.type == "cpu", f"init generator on {generator.device}, need the CPU"
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight")) else self.cfg.init_std
            weight = torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
            p.copy_(weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        assert T <= self.cfg.max_seq_len, f"sequence length {T} > max_seq_len {self.cfg.max_seq_len}"
        x = self.tok_embeddings(tokens)  # (B, T, C)
        for layer in self.layers:
            x = layer(x)  # (B, T, C)
        return self.output(self.norm(x))  # (B, T, V)
