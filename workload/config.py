"""Typed configuration of the reference workload, loaded from TOML.

    cfg = load_config("tiny", overrides=["model.dim=256", "optim.name=sgd"])

One frozen dataclass per component, nested in `Config`. Everything except `run`
decides the bits a training step produces, so it is what `tracer.config.config_fingerprint`
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
import difflib
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from tracer.errors import ConfigError

DEFAULT_CONFIG = "tiny"


class _InvalidValue(ConfigError):
    """A value that fails validation; `key` lets the loader say where it came from."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise _InvalidValue(key, message)


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
            _check(value >= 1, f"model.{name}", f"model.{name} = {value} must be >= 1")
        _check(self.vocab_size >= 256, "model.vocab_size",
               f"model.vocab_size = {self.vocab_size} is too small for byte-level tokens; "
               "set it to 256")
        _check(self.dim % self.n_heads == 0, "model.dim",
               f"model.dim = {self.dim} is not divisible by model.n_heads = {self.n_heads}; "
               f"set model.dim to a multiple of {self.n_heads}")
        _check(self.n_heads % self.n_kv_heads == 0, "model.n_kv_heads",
               f"model.n_heads = {self.n_heads} is not divisible by model.n_kv_heads = "
               f"{self.n_kv_heads}; set model.n_kv_heads to a divisor of {self.n_heads}")
        _check((self.dim // self.n_heads) % 2 == 0, "model.dim",
               f"head size model.dim / model.n_heads = {self.dim // self.n_heads} is odd; "
               "rotary embeddings rotate pairs, so make it even")
        for name in ("norm_eps", "rope_theta", "init_std"):
            value = getattr(self, name)
            _check(value > 0, f"model.{name}", f"model.{name} = {value} must be > 0")

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
            _check(value >= 1, f"data.{name}", f"data.{name} = {value} must be >= 1")
        _check(self.shuffle_seed >= 0, "data.shuffle_seed",
               f"data.shuffle_seed = {self.shuffle_seed} must be >= 0")


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
        _check(self.lr > 0, "optim.lr", f"optim.lr = {self.lr} must be > 0")
        _check(all(0 <= b < 1 for b in self.betas), "optim.betas",
               f"optim.betas = {list(self.betas)} must both lie in [0, 1)")
        _check(self.eps > 0, "optim.eps", f"optim.eps = {self.eps} must be > 0")
        for name in ("weight_decay", "warmup_steps", "grad_clip"):
            value = getattr(self, name)
            _check(value >= 0, f"optim.{name}", f"optim.{name} = {value} must be >= 0")
        _check(0 <= self.momentum < 1, "optim.momentum",
               f"optim.momentum = {self.momentum} must lie in [0, 1)")
        _check(0 <= self.min_lr <= self.lr, "optim.min_lr",
               f"optim.min_lr = {self.min_lr} must lie in [0, optim.lr = {self.lr}]")
        _check(self.schedule != "cosine" or self.schedule_steps > self.warmup_steps,
               "optim.schedule_steps",
               f"optim.schedule_steps = {self.schedule_steps} must exceed optim.warmup_steps "
               f"= {self.warmup_steps} for a cosine schedule")

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
        _check(self.seed >= 0, "train.seed", f"train.seed = {self.seed} must be >= 0")
        _check(self.threads >= 1, "train.threads", f"train.threads = {self.threads} must be >= 1")


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
            _check(value >= 1, f"parallel.{name}", f"parallel.{name} = {value} must be >= 1")


@dataclass(frozen=True)
class RunConfig:
    """How long and how a run executes; not part of the fingerprint."""

    steps: int = 30
    checkpoint_every: int = 10  # optimizer steps between checkpoints; 0 = never

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "run.steps", f"run.steps = {self.steps} must be >= 1")
        _check(self.checkpoint_every >= 0, "run.checkpoint_every",
               f"run.checkpoint_every = {self.checkpoint_every} must be >= 0 (0 = never)")


@dataclass(frozen=True)
class Config:
    """The whole workload; the dataclass defaults are the shipped `tiny` config."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        _check(self.data.seq_len <= self.model.max_seq_len, "data.seq_len",
               f"data.seq_len = {self.data.seq_len} exceeds model.max_seq_len = "
               f"{self.model.max_seq_len}; lower data.seq_len or raise model.max_seq_len")
        p, m = self.parallel, self.model
        _check(self.data.batch_size % p.dp == 0, "parallel.dp",
               f"data.batch_size = {self.data.batch_size} is not divisible by parallel.dp = {p.dp}; "
               "each replica takes an equal share of every microbatch")
        for key, value in (("model.n_heads", m.n_heads), ("model.n_kv_heads", m.n_kv_heads),
                           ("model.ffn_hidden", m.ffn_hidden)) + ((("data.seq_len", self.data.seq_len),) if p.sp else ()):
            _check(value % p.tp == 0, "parallel.tp",
                   f"{key} = {value} is not divisible by parallel.tp = {p.tp}; choose a tp that divides it")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain JSON-able dict (tuples become lists); what goes into every log header."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> Config:
        """Build and validate from a parsed TOML/JSON dict; errors name `source`."""
        return _build(d, lambda key: source)



def shipped_configs() -> dict[str, Path]:
    """Name -> path of every config that ships with the package."""
    folder = resources.files("workload") / "configs"
    return {p.name.removesuffix(".toml"): Path(str(p))
            for p in sorted(folder.iterdir(), key=lambda p: p.name) if p.name.endswith(".toml")}


def load_config(spec: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a shipped config by name, or a TOML file by path, then apply overrides.

    `spec` None means the default (`tiny`). Overrides are "section.key=value" strings,
    the value parsed as a TOML scalar or array (a bare word is taken as a string).
    """
    path = _resolve(spec)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}; fix that line") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}); save it as UTF-8") from None
    origins: dict[str, str] = {}
    for override in overrides:
        section, key, value = _parse_override(override)
        if section not in raw:
            origins[section] = f"override {override!r}"
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):  # e.g. `model = 1` in the file; let _build report it
            continue
        table[key] = value
        origins[f"{section}.{key}"] = f"override {override!r}"
    return _build(raw, lambda key: origins.get(key, str(path)))


def _resolve(spec: str | Path | None) -> Path:
    shipped = shipped_configs()
    if spec is None:
        spec = DEFAULT_CONFIG
    if isinstance(spec, str) and spec in shipped:
        return shipped[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"config {str(spec)!r} not found: no such file, and not a shipped name; "
            f"pass a path to a TOML file or one of: {', '.join(shipped)}")
    return path


def _parse_override(override: str) -> tuple[str, str, Any]:
    dotted, sep, text = override.partition("=")
    section, dot, key = dotted.strip().partition(".")
    if not sep or not dot or not section or not key or "." in key:
        raise ConfigError(f"override {override!r} must look like section.key=value, "
                          "e.g. model.dim=256")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word such as `sgd`: a string
    return section, key, value


_SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def _build(raw: Mapping[str, Any], origin: typing.Callable[[str], str]) -> Config:
    """Check names and types against the dataclasses, then construct (which validates)."""
    for name, table in raw.items():
        if name not in _SECTIONS:
            raise ConfigError(f"{origin(name)}: unknown section [{name}]"
                              f"{_did_you_mean(name, _SECTIONS)}; "
                              f"allowed sections: {', '.join(_SECTIONS)}")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{origin(name)}: [{name}] must be a table, found "
                              f"{_kind(table)}; write a [{name}] header with keys under it")
    sections = {}
    for name, cls in _SECTIONS.items():
        table = raw.get(name, {})
        hints = typing.get_type_hints(cls)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for key in table:
            if key not in hints:
                raise ConfigError(f"{origin(f'{name}.{key}')}: unknown key {name}.{key}"
                                  f"{_did_you_mean(key, hints, prefix=f'{name}.')}; "
                                  f"allowed keys in [{name}]: {', '.join(hints)}")
        sections[name] = {k: _coerce(v, hints[k], defaults[k], f"{name}.{k}", origin)
                          for k, v in table.items()}
    try:
        return Config(**{name: cls(**sections[name]) for name, cls in _SECTIONS.items()})
    except _InvalidValue as e:
        raise ConfigError(f"{origin(e.key)}: {e}") from None


def _coerce(value: Any, hint: Any, default: Any, key: str,
            origin: typing.Callable[[str], str]) -> Any:
    """Return `value` as the field's type, or raise naming expected vs found."""
    def wrong(expected: str) -> ConfigError:
        example = json.dumps(list(default) if isinstance(default, tuple) else default)
        return ConfigError(f"{origin(key)}: {key} must be {expected}, found {_kind(value)} "
                           f"{value!r}; write e.g. {key} = {example}")

    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if not isinstance(value, str):
            raise wrong("a string")
        if value not in choices:
            raise ConfigError(f"{origin(key)}: {key} = {value!r} is not one of "
                              f"{', '.join(map(repr, choices))}; pick one of them")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise wrong("a string")
        return value
    if typing.get_origin(hint) is tuple:  # tuple[float, float]
        n = len(typing.get_args(hint))
        if (not isinstance(value, (list, tuple)) or len(value) != n
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value)):
            raise wrong(f"an array of {n} numbers")
        return tuple(float(v) for v in value)
    raise TypeError(f"config field {key} has unsupported type {hint!r}")  # a bug, not a user error


def _did_you_mean(name: str, allowed: Mapping[str, Any], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)
