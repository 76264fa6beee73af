"""A study file: which nodes to record, how to replay, diff, fine-tune and report them.

    study = load_study("demo")            # shipped (sdc/study/studies/demo.toml)
    study = load_study("my-study.toml")   # or a path

A study is the whole RQ1-RQ3 experiment in one TOML file, so that it can be re-run
and compared: the golden node, the emulated nodes (each a fault profile), the
training config, the replay window and the fine-tuning settings. Mistakes fail
before anything runs, with a `ConfigError` naming the file, the key and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from faults import load_profile
from replay.request import MODES, parse_steps
from tracer import typed_toml
from tracer.errors import ConfigError
from tracer.guard import Policy
from tracer.typed_toml import check, require, toml_field
from workload.multiple_choice import FinetuneSettings
from workload.reference_config import MAX_SEED, Config, load_config, shipped_configs

# A label names folders (runs/<label>-guarded/, replays/<label>-param-sync/): 64 ASCII characters keep every such
# name far inside the file system's 255 bytes.
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DERIVED = ("-twin", "-lockstep", "-param-sync", "-guarded")  # suffixes of the runs a study derives from a node
_LABEL = (
    "letters, digits, '.', '_' or '-' (64 at most), not ending in -twin, -lockstep, -param-sync or -guarded "
    "(they name derived runs)"
)
_POLICY = f"one of {', '.join(get_args(Policy))}: the node is recorded a second time, guarded, as <label>-guarded"


def _check_label(label: str, key: str) -> None:
    shown = label if len(label) <= 80 else f"{label[:40]}... ({len(label)} characters)"
    require(bool(LABEL.fullmatch(label)) and not label.endswith(DERIVED), key, shown, _LABEL)


@dataclass(frozen=True)
class Node:
    """One emulated node: a label, the fault profile that plays it, and its checks. With ``guard`` (a policy),
    the node is also recorded under the guard's default detectors (`tracer.guard.default_guard`) as
    ``<label>-guarded``, diffed and fine-tuned like the others: what guarding changed."""

    label: str = toml_field(expected=_LABEL)
    profile: str = toml_field(expected="a shipped fault profile's name or a path to a profile file")
    fault_seed: int = 0
    abft: bool = False
    guard: str | None = toml_field(None, expected=_POLICY)

    def __post_init__(self) -> None:
        _check_label(self.label, "label")
        require(self.guard is None or self.guard in get_args(Policy), "guard", self.guard, _POLICY)
        require(0 <= self.fault_seed <= MAX_SEED, "fault_seed", self.fault_seed, f"an integer in 0..{MAX_SEED}")

    @property
    def guarded(self) -> str | None:
        """The guarded recording's label, if the node has one."""
        return f"{self.label}-guarded" if self.guard is not None else None


@dataclass(frozen=True)
class Replay:
    """The steps every node is replayed over, in each mode (RQ1 lockstep, RQ2 param-sync)."""

    steps: range
    modes: tuple[str, ...]


@dataclass(frozen=True)
class Finetune:
    """RQ3b: fine-tune every node's final model with ``settings``, and the golden one again with
    ``twin_shuffle_seed`` as its shuffle seed (the twin: the baseline of prediction disagreement); with
    ``twins`` > 1, also with the next seeds, labelled `twin_labels` (a distribution of shuffle-seed twins; the
    nodes' pairs take them as baselines in turn, so a study needs at least as many nodes as twins)."""

    settings: FinetuneSettings
    twin_shuffle_seed: int
    twins: int = 1

    def twin_labels(self, golden: str) -> list[tuple[str, int]]:
        """(label, shuffle seed) of each twin: ``<golden>-twin`` (the pairs' baseline), ``<golden>-twin-2`` ..."""
        return [
            (f"{golden}-twin" + (f"-{k}" if k > 1 else ""), self.twin_shuffle_seed + k - 1)
            for k in range(1, self.twins + 1)
        ]


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
    sharpness: int = 0  # power iterations of the golden run's sharpness at each checkpoint (0: not measured)


# -- the file as written; `_build` resolves it into a `Study` ---------------------------------------


@dataclass(frozen=True)
class _Train:
    config: str = "tiny"  # a shipped workload config, or a path relative to the study file
    set: tuple[str, ...] = ()  # section.key=value overrides


@dataclass(frozen=True)
class _Golden:
    label: str = toml_field("golden", expected=_LABEL)
    abft: bool = False

    def __post_init__(self) -> None:
        _check_label(self.label, "label")


@dataclass(frozen=True)
class _Replay:
    steps: str | None = None  # "start:stop"; None: the first 8 recorded steps
    modes: tuple[str, ...] = MODES

    def __post_init__(self) -> None:
        for m in self.modes:
            _check_mode(m)


def _check_mode(mode: str) -> None:
    check(mode in MODES, "modes", lambda at: f"{at}modes: {mode!r} is not a replay mode; use {', '.join(MODES)}")


@dataclass(frozen=True)
class FinetuneTable:
    """A study file's ``[finetune]`` table: whether to fine-tune, the `FinetuneSettings` it changes (the others
    keep their defaults) and the twin's shuffle seed."""

    enabled: bool = True
    steps: int | None = None  # None: the fine-tuning default
    tasks: tuple[str, ...] = ()  # empty: the default ladder
    eval_every: int | None = None  # None: the fine-tuning default
    batch_size: int | None = None  # examples per step; None: the fine-tuning default
    twin_shuffle_seed: int = 1
    twins: int = toml_field(1, expected="an integer from 1 to 20: shuffle-seed twins of the golden fine-tune")

    def __post_init__(self) -> None:
        require(
            0 <= self.twin_shuffle_seed <= MAX_SEED - 20,
            "twin_shuffle_seed",
            self.twin_shuffle_seed,
            f"an integer in 0..{MAX_SEED - 20}",
        )
        require(1 <= self.twins <= 20, "twins", self.twins, "an integer from 1 to 20")
        self.plan()  # FinetuneSettings checks the values; the loader names the key

    def plan(self) -> Finetune | None:
        """What the study fine-tunes; None when the table disables fine-tuning."""
        if not self.enabled:
            return None
        given = {
            "steps": self.steps,
            "tasks": self.tasks or None,
            "eval_every": self.eval_every,
            "batch_size": self.batch_size,
        }
        return Finetune(
            FinetuneSettings(**{k: v for k, v in given.items() if v is not None}), self.twin_shuffle_seed, self.twins
        )


@dataclass(frozen=True)
class _StudyFile:
    description: str = ""
    train: _Train = field(default_factory=_Train)
    golden: _Golden = field(default_factory=_Golden)
    node: tuple[Node, ...] = ()
    replay: _Replay = field(default_factory=_Replay)
    finetune: FinetuneTable = field(default_factory=FinetuneTable)


def is_fleet_file(data: dict) -> bool:
    """A study file with a ``[fleet]`` table is a fleet study (sdc.study.fleet_study)."""
    return isinstance(data.get("fleet"), dict)


def shipped_studies() -> dict[str, Path]:
    """Name -> path of every study file that ships with sdctrace."""
    return typed_toml.shipped("sdc.study", "studies")


def load_study(spec: str | Path, overrides: tuple[str, ...] = ()) -> Study:
    """Load a shipped study by name or a study file by path; `overrides` go to its training config."""
    path = typed_toml.resolve(spec, shipped_studies(), "study")
    data = typed_toml.read(path)
    if is_fleet_file(data):
        raise ConfigError(
            f"{path}: is a fleet study (it has a [fleet] table); load it with "
            "sdc.study.fleet_study.load_fleet_study, or run it with `sdc study`"
        )
    return _build(typed_toml.from_dict(_StudyFile, data, str(path)), path, overrides)


def _build(f: _StudyFile, path: Path, overrides: tuple[str, ...]) -> Study:
    """The study the file describes, checked against what it names: the config, the profiles, the steps."""
    if not f.node:
        raise ConfigError(
            f"{path}: no [[node]] tables; add at least one emulated node "
            '(label = "node-1", profile = "bursty-mismatch")'
        )
    nodes = [
        Node(
            n.label,
            n.profile if "/" not in n.profile and not n.profile.endswith(".toml") else str(_relative(path, n.profile)),
            n.fault_seed,
            n.abft,
            n.guard,
        )
        for n in f.node
    ]
    return build_study(
        name=path.name.removesuffix(".toml"),
        source=path,
        description=f.description,
        config=f.train.config,
        sets=f.train.set + tuple(overrides),
        golden=f.golden.label,
        abft_golden=f.golden.abft,
        nodes=nodes,
        replay_steps=f.replay.steps,
        modes=f.replay.modes or MODES,
        finetune=f.finetune.plan(),
    )


def build_study(
    *,
    name: str,
    source: Path,
    description: str,
    config: str,
    sets: tuple[str, ...],
    golden: str,
    nodes: list[Node],
    replay_steps: str | None,
    modes: tuple[str, ...],
    finetune: Finetune | None,
    abft_golden: bool = False,
    key: str = "",
    sharpness: int = 0,
) -> Study:
    """A `Study` checked against what it names (the config, the profiles, the steps); errors name `source` and
    the key under `key` (a table of a larger file, or "" for a study file's top level)."""

    def error(name: str, message: str) -> ConfigError:
        return ConfigError(f"{source}: {key}{name}: {message}")

    cfg = load_config(config if config in shipped_configs() else _relative(source, config), sets)
    if cfg.parallel.dp * cfg.parallel.tp > 1:
        raise error(
            "train.set",
            "studies run single-rank for now; record and replay multi-rank runs with "
            "`sdc record --nproc` and `sdc replay` (docs/parallel.md)",
        )
    if cfg.run.checkpoint_every == 0:
        raise error("train.set", "run.checkpoint_every is 0; replay, drift and fine-tuning need checkpoints")
    labels = [golden, *(n.label for n in nodes)]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"{source}: node label(s) {', '.join(dupes)} used twice; give every node its own label")
    for i, n in enumerate(nodes):
        try:
            load_profile(n.profile)
        except ConfigError as e:
            raise error(f"node[{i}].profile", str(e)) from None

    suspects = len(nodes) + sum(1 for n in nodes if n.guarded is not None)
    if finetune is not None and finetune.twins > suspects:
        raise ConfigError(
            f"{source}: finetune.twins: {finetune.twins} twins need at least as many nodes to pair "
            f"with (each pair takes one twin as its baseline), and there are {suspects}"
        )
    text = replay_steps or f"0:{min(cfg.run.steps, 8)}"
    try:
        steps = parse_steps(text)
    except ConfigError as e:
        raise error("replay.steps", str(e)) from None
    if steps.stop > cfg.run.steps:
        raise error(
            "replay.steps",
            f"{text!r} reaches past the {cfg.run.steps} recorded steps; end it at {cfg.run.steps} or less",
        )
    return Study(
        name=name,
        source=source,
        description=description,
        train=cfg,
        golden=golden,
        abft_golden=abft_golden,
        nodes=tuple(nodes),
        replay=Replay(steps, tuple(modes)),
        finetune=finetune,
        config_spec=config,
        config_overrides=sets,
        sharpness=sharpness,
    )


def _relative(study: Path, spec: str) -> Path:
    """Paths inside a study file are relative to the file, so a study folder can move."""
    p = Path(spec)
    return p if p.is_absolute() else study.parent / p
