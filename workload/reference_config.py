"""Typed configuration of the reference workload, loaded from TOML.

    cfg = load_config("tiny", overrides=["model.dim=256", "optim.name=sgd"])

One frozen dataclass per component, nested in `Config`. Everything except `run`
decides the bits a training step produces, so it is what `tracer.config_fingerprint.config_fingerprint`
hashes and what a pair of runs must agree on; `run` only says how long to train,
so a 20-step and a 200-step run of the same config still pair. `parallel` (the
layout) decides the bits too, but pairing compares it field by field, so it stays
out of the fingerprint and a refused pair names the field.

Every mistake fails fast with a one-line `ConfigError` naming the file, the dotted
key and the fix: a config that silently fell back to a default would make two
"identical" runs differ, which is exactly what this tool must never cause.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tracer import typed_toml
from tracer.log.records import MAX_STEP
from tracer.typed_toml import INT64_MAX, check, require
from workload.protocol import RunSettings

DEFAULT_CONFIG = "tiny"
# Largest model the reference workload builds (a llama3-style 8B is 8e9): a typo such as dim=1048576 is refused
# before torch tries to allocate terabytes.
MAX_PARAMETERS = 10_000_000_000
MAX_SEED = INT64_MAX  # torch.manual_seed takes < 2^64, numpy's default_rng any int >= 0: TOML's 64-bit ints fit both


def decoder_parameters(vocab_size: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, ffn_hidden: int) -> int:
    """Parameters of the reference LLaMA-style decoder: the embedding and output head, per layer the query and output
    projections, the grouped key and value projections, the SwiGLU feed-forward's three matrices and two norms, and
    the final norm (no biases)."""
    kv = dim // n_heads * n_kv_heads
    layer = dim * (2 * dim + 2 * kv) + 3 * dim * ffn_hidden + 2 * dim
    return 2 * vocab_size * dim + n_layers * layer + dim


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the LLaMA-style decoder."""

    vocab_size: int = 256  # byte-level tokens
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: n_heads / n_kv_heads queries share a kv head
    ffn_hidden: int = 384
    max_seq_len: int = 128
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02
    dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
            value = getattr(self, name)
            require(value >= 1, name, value, ">= 1")
        check(
            self.vocab_size >= 256,
            "vocab_size",
            lambda at: f"{at}vocab_size = {self.vocab_size} is too small for byte-level tokens; set it to 256",
        )
        check(
            self.dim % self.n_heads == 0,
            "dim",
            lambda at: (
                f"{at}dim = {self.dim} is not divisible by {at}n_heads = {self.n_heads}; "
                f"set {at}dim to a multiple of {self.n_heads}"
            ),
        )
        check(
            self.n_heads % self.n_kv_heads == 0,
            "n_kv_heads",
            lambda at: (
                f"{at}n_heads = {self.n_heads} is not divisible by {at}n_kv_heads = "
                f"{self.n_kv_heads}; set {at}n_kv_heads to a divisor of {self.n_heads}"
            ),
        )
        check(
            (self.dim // self.n_heads) % 2 == 0,
            "dim",
            lambda at: (
                f"head size {at}dim / {at}n_heads = {self.dim // self.n_heads} is odd; "
                "rotary embeddings rotate pairs, so make it even"
            ),
        )
        for name in ("norm_eps", "rope_theta", "init_std"):
            value = getattr(self, name)
            require(0 < value < math.inf, name, value, "a finite number > 0")
        check(
            self.parameters <= MAX_PARAMETERS,
            "dim",
            lambda at: (
                f"the model would have {self.parameters:,} parameters ({at}dim = {self.dim}, "
                f"{at}n_layers = {self.n_layers}, {at}ffn_hidden = {self.ffn_hidden}, "
                f"{at}vocab_size = {self.vocab_size}), over the {MAX_PARAMETERS:,} this reference workload "
                "builds; make them smaller, or trace your own model with --workload"
            ),
        )

    @property
    def parameters(self) -> int:
        """Parameters of the decoder, computed before anything is allocated (`decoder_parameters`)."""
        return decoder_parameters(
            self.vocab_size, self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.ffn_hidden
        )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass(frozen=True)
class DataConfig:
    """What each microbatch contains; `shuffle_seed` alone changes the data order."""

    seq_len: int = 64
    batch_size: int = 8  # sequences per microbatch
    microbatches: int = 2  # gradient accumulation steps per optimizer step
    shuffle_seed: int = 0
    corpus: Literal["embedded"] = "embedded"

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "microbatches"):
            value = getattr(self, name)
            require(value >= 1, name, value, ">= 1")
        require(0 <= self.shuffle_seed <= MAX_SEED, "shuffle_seed", self.shuffle_seed, f"an integer in 0..{MAX_SEED}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule.

    `schedule_steps` is the decay horizon, deliberately not the run length: runs of
    different length compute identical steps for as long as both last.
    """

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    momentum: float = 0.9  # sgd only
    warmup_steps: int = 10
    schedule: Literal["cosine", "constant"] = "cosine"
    schedule_steps: int = 1000
    min_lr: float = 1e-4
    grad_clip: float = 1.0  # max global grad norm; 0 = off

    def __post_init__(self) -> None:
        require(0 < self.lr < math.inf, "lr", self.lr, "a finite number > 0")
        check(
            all(0 <= b < 1 for b in self.betas),
            "betas",
            lambda at: f"{at}betas = {list(self.betas)} must both lie in [0, 1)",
        )
        require(0 < self.eps < math.inf, "eps", self.eps, "a finite number > 0")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            require(0 <= value < math.inf, name, value, "a finite number >= 0")
        for name in ("warmup_steps", "schedule_steps"):
            value = getattr(self, name)
            require(
                0 <= value <= MAX_STEP, name, value, f"an integer in 0..{MAX_STEP} (the largest step a log records)"
            )
        check(0 <= self.momentum < 1, "momentum", lambda at: f"{at}momentum = {self.momentum} must lie in [0, 1)")
        check(
            0 <= self.min_lr <= self.lr,
            "min_lr",
            lambda at: f"{at}min_lr = {self.min_lr} must lie in [0, {at}lr = {self.lr}]",
        )
        check(
            self.schedule != "cosine" or self.schedule_steps > self.warmup_steps,
            "schedule_steps",
            lambda at: (
                f"{at}schedule_steps = {self.schedule_steps} must exceed {at}warmup_steps "
                f"= {self.warmup_steps} for a cosine schedule"
            ),
        )

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based): linear warmup, then the schedule."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        progress = min(1.0, (step - self.warmup_steps) / (self.schedule_steps - self.warmup_steps))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class TrainConfig:
    """Process-level settings that change the bits of a step."""

    seed: int = 0  # model init
    threads: int = 2  # intra-op threads: a different count changes reduction order

    def __post_init__(self) -> None:
        require(
            0 <= self.seed <= MAX_SEED, "seed", self.seed, f"an integer in 0..{MAX_SEED} (what torch.manual_seed takes)"
        )
        check(self.threads >= 1, "threads", lambda at: f"{at}threads = {self.threads} must be >= 1")


@dataclass(frozen=True)
class ParallelConfig:
    """How ranks split the work (`tracer.parallel.Layout`); world size = dp * tp.

    Not part of `config_fingerprint`: pairing compares the layout field by field, so a
    refused pair names the field that differs.
    """

    dp: int = 1  # data-parallel replicas; each takes batch_size / dp sequences of a microbatch
    tp: int = 1  # tensor-parallel ranks: attention heads and feed-forward width split over them
    sp: bool = False  # sequence parallelism: the residual stream split over the tp ranks by position

    def __post_init__(self) -> None:
        for name in ("dp", "tp"):
            value = getattr(self, name)
            require(value >= 1, name, value, ">= 1")


@dataclass(frozen=True)
class Config:
    """The whole workload; the dataclass defaults are the shipped `tiny` config."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        check(
            self.data.seq_len <= self.model.max_seq_len,
            "data.seq_len",
            lambda at: (
                f"{at}data.seq_len = {self.data.seq_len} exceeds {at}model.max_seq_len = "
                f"{self.model.max_seq_len}; lower {at}data.seq_len or raise {at}model.max_seq_len"
            ),
        )
        p, m = self.parallel, self.model
        check(
            self.data.batch_size % p.dp == 0,
            "parallel.dp",
            lambda at: (
                f"{at}data.batch_size = {self.data.batch_size} is not divisible by {at}parallel.dp = "
                f"{p.dp}; each replica takes an equal share of every microbatch"
            ),
        )

        def split_by_tp(key: str, value: int) -> None:
            check(
                value % p.tp == 0,
                "parallel.tp",
                lambda at: (
                    f"{at}{key} = {value} is not divisible by {at}parallel.tp = {p.tp}; choose a tp that divides it"
                ),
            )

        for key, value in (
            ("model.n_heads", m.n_heads),
            ("model.n_kv_heads", m.n_kv_heads),
            ("model.ffn_hidden", m.ffn_hidden),
        ) + ((("data.seq_len", self.data.seq_len),) if p.sp else ()):
            split_by_tp(key, value)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain JSON-able dict (tuples become lists); what goes into every log header."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> Config:
        """Build and validate from a parsed TOML/JSON dict; errors name `source`."""
        return typed_toml.from_dict(cls, d, source)


def shipped_configs() -> dict[str, Path]:
    """Name -> path of every config that ships with the package."""
    return typed_toml.shipped("workload", "configs")


def load_config(spec: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a shipped config by name, or a TOML file by path, then apply overrides.

    `spec` None means the default (`tiny`). Overrides are "section.key=value" strings,
    the value parsed as a TOML scalar or array (a bare word is taken as a string).
    """
    path = typed_toml.resolve(DEFAULT_CONFIG if spec is None else spec, shipped_configs(), "config")
    return typed_toml.load(Config, path, overrides)
