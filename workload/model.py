"""A LLaMA-style decoder: the model the reference workload trains.

    model = Transformer(load_config("tiny").model)
    model.init_weights(torch.Generator().manual_seed(seed))
    logits = model(tokens)  # (B, T) int64 -> (B, T, vocab_size)

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU
feed-forward, in pre-norm residual blocks. Module paths are part of the contract:
the tracer finds its sites at `layers.{i}.attention` and `layers.{i}.feed_forward`,
and each of those takes one tensor and returns one, so a replay can swap in golden
inputs. With tensor parallelism (`workload.model_parallel`) each rank holds a shard
of every attention and feed-forward weight, those sites return the rank's partial
output, and `Collective` modules around them combine it. Rotary embeddings use
real arithmetic (no complex tensors) so that XLA can compile them, and attention
goes through `F.scaled_dot_product_attention`, the op the fault emulator intercepts.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from workload.model_parallel import ENTER, LEAVE, SINGLE, Collective, Groups
from workload.reference_config import ModelConfig

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
    """Grouped-query attention over this rank's ``n_heads / tp`` heads (wq, wk, wv by columns, wo by rows)."""

    def __init__(self, cfg: ModelConfig, tp: int = 1) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, self.n_heads * cfg.head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(cfg.dim, self.n_kv_heads * cfg.head_dim, bias=False, dtype=dtype)
        self.wv = nn.Linear(cfg.dim, self.n_kv_heads * cfg.head_dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(self.n_heads * cfg.head_dim, cfg.dim, bias=False, dtype=dtype)
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
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H * D)
        return self.wo(y)  # (B, T, C); a partial sum over heads when tp > 1


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), over this rank's ``ffn_hidden / tp`` hidden units."""

    def __init__(self, cfg: ModelConfig, tp: int = 1) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        hidden = cfg.ffn_hidden // tp
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False, dtype=dtype)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, C)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, groups: Groups = SINGLE, path: str = "") -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        tp, sp = groups.layout.tp, groups.layout.sp
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, dtype)
        self.attention = Attention(cfg, tp)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, dtype)
        self.feed_forward = FeedForward(cfg, tp)
        self.parallel = tp > 1
        if self.parallel:
            self.attention_in = Collective(f"{path}attention_in", ENTER[sp], groups.tp)
            self.attention_out = Collective(f"{path}attention_out", LEAVE[sp], groups.tp)
            self.feed_forward_in = Collective(f"{path}feed_forward_in", ENTER[sp], groups.tp)
            self.feed_forward_out = Collective(f"{path}feed_forward_out", LEAVE[sp], groups.tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.parallel:
            x = x + self.attention(self.attention_norm(x))  # (B, T, C)
            return x + self.feed_forward(self.ffn_norm(x))  # (B, T, C)
        # With sp, x is this rank's slice of the sequence: (B, T / tp, C).
        x = x + self.attention_out(self.attention(self.attention_in(self.attention_norm(x))))
        return x + self.feed_forward_out(self.feed_forward(self.feed_forward_in(self.ffn_norm(x))))


# Tensor-parallel weights and the dimension they are split along (column-parallel: 0, row-parallel: 1).
SHARDED = {
    "attention.wq.weight": 0,
    "attention.wk.weight": 0,
    "attention.wv.weight": 0,
    "attention.wo.weight": 1,
    "feed_forward.w1.weight": 0,
    "feed_forward.w3.weight": 0,
    "feed_forward.w2.weight": 1,
}


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, groups: Groups = SINGLE) -> None:
        super().__init__()
        dtype = DTYPES[cfg.dtype]
        self.cfg = cfg
        self.groups = groups
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, dtype=dtype)
        self.layers = nn.ModuleList(TransformerBlock(cfg, groups, f"layers.{i}.") for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, dtype)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, dtype=dtype)

    def shard_dim(self, name: str) -> int | None:
        """The dimension parameter ``name`` is split along over the tensor-parallel ranks (None: held whole)."""
        if self.groups.layout.tp == 1:
            return None
        return next((d for suffix, d in SHARDED.items() if name.endswith(suffix)), None)

    def sequence_shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the sequence (dim 1) under sequence parallelism; ``t`` itself otherwise."""
        layout = self.groups.layout
        if not (layout.sp and layout.tp > 1):
            return t
        n = t.shape[1] // layout.tp
        return t.narrow(1, self.groups.tp_rank * n, n)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Reproducible init: every weight drawn from one CPU generator in parameter order.

        Drawing in float32 on the CPU and copying makes the initial bits the same on
        every device, so runs on different hardware start from the same point.
        Residual output projections (wo, w2) are scaled by 1/sqrt(2 * n_layers), as in
        GPT-2, so the residual stream does not grow with depth. A tensor-parallel rank
        draws every weight whole and keeps its shard, so any layout starts from the
        weights of the single-rank model.
        """
        assert generator.device.type == "cpu", f"init generator on {generator.device}, need the CPU"
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight")) else self.cfg.init_std
            dim = self.shard_dim(name)
            shape = list(p.shape)
            if dim is not None:
                shape[dim] *= self.groups.layout.tp
            weight = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
            if dim is not None:
                weight = weight.narrow(dim, self.groups.tp_rank * p.shape[dim], p.shape[dim])
            p.copy_(weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        assert T <= self.cfg.max_seq_len, f"sequence length {T} > max_seq_len {self.cfg.max_seq_len}"
        x = self.sequence_shard(self.tok_embeddings(tokens))  # (B, T, C); (B, T / tp, C) with sp
        for layer in self.layers:
            x = layer(x)  # (B, T, C)
        return self.output(self.norm(x))  # (B, T, V); this rank's slice of T with sp
