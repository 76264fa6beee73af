"""Models the way users write them, for the Tracer's end-to-end tests: tiny Hugging Face ones from a config
(random init, nothing downloaded), a GPT-2-style model of our own, and a plain nn.Sequential."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ = 64, 8


def tiny_llama_config():  # noqa: ANN201 - transformers is imported lazily
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=SEQ,
        id2label={0: "no", 1: "yes"},
    )


def tiny_llama() -> nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config())


def tiny_hf_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2))


class CausalSelfAttention(nn.Module):
    """GPT-2's attention: one fused qkv projection; returns ``(output, present)`` as GPT-2 does."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, hidden_states: torch.Tensor, layer_past: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        B, T, C = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(C, dim=2)  # each (B, T, C)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C)), None


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(hidden_states=self.ln_1(x))[0]  # called with a keyword, as Hugging Face layers do
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks in ``h``, a tied head: ``(B, T) int64 -> (B, T, VOCAB)``."""

    def __init__(self, dim: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(SEQ, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=1 / math.sqrt(dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))  # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # (B, T, VOCAB)


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT()


def tiny_sequential() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
