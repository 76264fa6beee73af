"""A study file: which nodes to record, how to replay, diff, fine-tune and report them.

    study = load_study("demo")            # shipped (sdc/study/studies/demo.toml)
    study = load_study("my-study.toml")   # or a path

A study is the whole RQ1-RQ3 experiment in one TOML file, so that it can be re-run
and compared: the golden node, the emulated nodes (each a fault profile), the
training config, the replay window and the fine-tuning settings. Mistakes fail
before anything runs, with a `ConfigError` naming the file, the key and the fix.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from faults import load_profile
from replay.engine import MODES, parse_steps
from tracer.errors import ConfigError
from workload.config import Config, load_config, shipped_configs

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Node:
    """One emulated node: a label, the fault profile that plays it, and its checks."""

    label: str
    profile: str
    fault_seed: int = 0
    abft: bool = False


@dataclass(frozen=True)
class Replay:
    """The steps every node is replayed over, in each mode (RQ1 lockstep, RQ2 param-sync)."""

    steps: range
    modes: tuple[str, ...]


@dataclass(frozen=True)
class Finetune:
    """RQ3b: fine-tune every node's final model; 0 steps skips fine-tuning."""

    steps: int | None
    tasks: tuple[str, ...]  # empty: every shipped task
    twin_shuffle_seed: int


@dataclass(frozen=True)
class Study:
    name: str
    source: Path
    description: str
    train: Config
    golden: str
    nodes: tuple[Node, ...]
    replay: Replay
    finetune: Finetune | None
    abft_golden: bool = False
    config_spec: str = "tiny"
    config_overrides: tuple[str, ...] = field(default=())


def shipped_studies() -> dict[str, Path]:
    """Name -> path of every study file that ships with sdctrace."""
    folder = resources.files("sdc.study") / "studies"
    return {p.name.removesuffix(".toml"): Path(str(p))
            for p in sorted(folder.iterdir(), key=lambda p: p.name) if p.name.endswith(".toml")}


def load_study(spec: str | Path, overrides: tuple[str, ...] = ()) -> Study:
    """Load a shipped study by name or a study file by path; `overrides` go to its training config."""
    shipped = shipped_studies()
    path = shipped[spec] if isinstance(spec, str) and spec in shipped else Path(spec)
    if not path.is_file():
        raise ConfigError(f"study {str(spec)!r} not found: no such file, and not a shipped study; "
                          f"pass a path to a study TOML file or one of: {', '.join(shipped)}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}; fix that line") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}); save it as UTF-8") from None
    return _build(raw, path, overrides)


class _Table:
    """Typed access to one TOML table that reports unknown and mistyped keys by name."""

    def __init__(self, raw: Any, where: str, path: Path, allowed: tuple[str, ...]) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{path}: [{where}] must be a table of keys, found {type(raw).__name__}")
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"{path}: unknown key {where}.{key}{hint}; allowed keys: {', '.join(allowed)}")
        self.raw, self.where, self.path = raw, where, path

    def get(self, key: str, kind: type, default: Any) -> Any:
        value = self.raw.get(key, default)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if value is not None and not ok:
            raise ConfigError(f"{self.path}: {self.where}.{key} must be {_KINDS[kind]}, found {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.path}: {self.where}.{key} must be an array of strings, found {value!r}")
        return tuple(value)

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {self.where}.{key}: {message}")


_KINDS = {str: "a string", int: "an integer", bool: "true or false"}


def _build(raw: Mapping[str, Any], path: Path, overrides: tuple[str, ...]) -> Study:
    top = _Table(raw, "study", path, ("description", "train", "golden", "node", "replay", "finetune"))
    train = _Table(raw.get("train", {}), "train", path, ("config", "set"))
    spec = train.get("config", str, "tiny")
    sets = train.strings("set") + tuple(overrides)
    cfg = load_config(spec if spec in shipped_configs() else _relative(path, spec), sets)
    if cfg.parallel.dp * cfg.parallel.tp > 1:
        raise train.error("set", "studies run single-rank for now; record and replay multi-rank runs with "
                                 "`sdc record --nproc` and `sdc replay` (docs/parallel.md)")
    if cfg.run.checkpoint_every == 0:
        raise train.error("set", "run.checkpoint_every is 0; replay, drift and fine-tuning need checkpoints")

    golden_t = _Table(raw.get("golden", {}), "golden", path, ("label", "abft"))
    golden = golden_t.get("label", str, "golden")
    nodes = tuple(_node(n, i, path) for i, n in enumerate(_array(raw.get("node", []), "node", path)))
    if not nodes:
        raise ConfigError(f"{path}: no [[node]] tables; add at least one emulated node "
                          "(label = \"node-1\", profile = \"bursty-mismatch\")")
    labels = [golden, *(n.label for n in nodes)]
    for label in labels:
        if not LABEL.fullmatch(label) or label.endswith(("-twin", "-lockstep", "-param-sync")):
            raise ConfigError(f"{path}: node label {label!r} must be letters, digits, '.', '_' or '-' "
                              "and not end in -twin, -lockstep or -param-sync (they name derived runs)")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"{path}: node label(s) {', '.join(dupes)} used twice; give every node its own label")

    replay_t = _Table(raw.get("replay", {}), "replay", path, ("steps", "modes"))
    text = replay_t.get("steps", str, f"0:{min(cfg.run.steps, 8)}")
    try:
        steps = parse_steps(text)
    except ConfigError as e:
        raise replay_t.error("steps", str(e)) from None
    if steps.stop > cfg.run.steps:
        raise replay_t.error("steps", f"{text!r} reaches past the {cfg.run.steps} recorded steps; "
                                      f"end it at {cfg.run.steps} or less")
    modes = replay_t.strings("modes") or tuple(MODES)
    for m in modes:
        if m not in MODES:
            raise replay_t.error("modes", f"{m!r} is not a replay mode; use {', '.join(MODES)}")

    ft_t = _Table(raw.get("finetune", {}), "finetune", path, ("enabled", "steps", "tasks", "twin_shuffle_seed"))
    finetune = None
    if ft_t.get("enabled", bool, True):
        ft_steps = ft_t.get("steps", int, None)
        if ft_steps is not None and ft_steps < 1:
            raise ft_t.error("steps", f"{ft_steps} must be >= 1 (set enabled = false to skip fine-tuning)")
        seed = ft_t.get("twin_shuffle_seed", int, 1)
        finetune = Finetune(ft_steps, ft_t.strings("tasks"), seed)
    return Study(
        name=path.name.removesuffix(".toml"),
        source=path,
        description=top.get("description", str, ""),
        train=cfg,
        golden=golden,
        abft_golden=golden_t.get("abft", bool, False),
        nodes=nodes,
        replay=Replay(steps, modes),
        finetune=finetune,
        config_spec=spec,
        config_overrides=sets,
    )


def _node(raw: Any, index: int, path: Path) -> Node:
    t = _Table(raw, f"node[{index}]", path, ("label", "profile", "fault_seed", "abft"))
    label, profile = t.get("label", str, None), t.get("profile", str, None)
    if label is None or profile is None:
        raise ConfigError(f"{path}: [[node]] number {index + 1} needs both label and profile")
    spec = profile if "/" not in profile and not profile.endswith(".toml") else str(_relative(path, profile))
    try:
        load_profile(spec)
    except ConfigError as e:
        raise t.error("profile", str(e)) from None
    return Node(label, spec, t.get("fault_seed", int, 0), t.get("abft", bool, False))


def _array(raw: Any, key: str, path: Path) -> list[Any]:
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: {key} must be an array of tables ([[{key}]]), found {type(raw).__name__}")
    return raw


def _relative(study: Path, spec: str) -> Path:
    """Paths inside a study file are relative to the file, so a study folder can move."""
    p = Path(spec)
    return p if p.is_absolute() else study.parent / p

