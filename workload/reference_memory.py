"""The memory one rank of the reference workload holds during a step, at the least, read from a run header's config
before anything is built (`jobs.machine.check_resources` bounds it by this machine's memory).

    need = StepMemory.of(header.config)        # None: not the reference workload's keys
    need.bytes, need.describe()

The config comes from a file, so it is read field by field into typed values and never built into a `Config`
(which would allocate nothing, but refuses sizes this bound should name in its own words).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workload.reference_config import decoder_parameters

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
STATE_BYTES = 12  # per parameter beyond its own: a float32 gradient-sized buffer and AdamW's two float32 moments
_MODEL_KEYS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden")


@dataclass(frozen=True)
class StepMemory:
    """The sizes of a reference workload's step that decide its memory: the model's shape, one rank's microbatch
    (``batch_size / dp`` sequences of ``seq_len`` tokens) and the bytes of the model's dtype."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    batch_size: int
    seq_len: int
    dp: int = 1
    dtype_bytes: int = 4

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> StepMemory | None:
        """The sizes in a header's ``config``; None when it lacks the reference workload's model and data keys
        (another workload's config) or ``model.n_heads`` is below 1."""
        found = {k: _int(config, "model", k) for k in _MODEL_KEYS}
        model = {k: v for k, v in found.items() if v is not None}
        batch, seq = _int(config, "data", "batch_size"), _int(config, "data", "seq_len")
        if len(model) < len(_MODEL_KEYS) or batch is None or seq is None or model["n_heads"] < 1:
            return None
        table = config.get("model")
        dtype = table.get("dtype", "float32") if isinstance(table, Mapping) else "float32"
        return cls(
            **model,
            batch_size=batch,
            seq_len=seq,
            dp=_int(config, "parallel", "dp") or 1,
            dtype_bytes=DTYPE_BYTES.get(dtype, 4) if isinstance(dtype, str) else 4,
        )

    @property
    def parameters(self) -> int:
        return decoder_parameters(
            self.vocab_size, self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.ffn_hidden
        )

    @property
    def bytes(self) -> int:
        """The weights with their gradients and AdamW moments, and one microbatch's activations and float32 logits
        (with their gradient)."""
        tokens = max(self.batch_size // self.dp, 1) * self.seq_len
        weights = self.parameters * (self.dtype_bytes + STATE_BYTES)
        activations = tokens * self.n_layers * (4 * self.dim + 3 * self.ffn_hidden) * self.dtype_bytes
        return weights + activations + tokens * self.vocab_size * 4 * 2

    def describe(self) -> str:
        """What `bytes` counts, naming the config's fields."""
        return (
            f"{self.parameters:,} parameters (model.*) and a microbatch of data.batch_size = {self.batch_size} "
            f"sequences of data.seq_len = {self.seq_len} tokens"
        )


def _int(config: Mapping[str, Any], section: str, key: str) -> int | None:
    table = config.get(section)
    value = table.get(key) if isinstance(table, Mapping) else None
    return value if type(value) is int else None
