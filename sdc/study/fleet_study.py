"""The fleet study: the reference study's three experiments on an emulated fleet, and the reproduction table.

    fleet = load_fleet_study("fleet")            # shipped (sdc/study/studies/fleet.toml), or a path
    result = run_fleet_study(fleet, Path("fleet"))

A fleet study file has a ``[fleet]`` table (how many unhealthy nodes, the fleet models they
are drawn from, `faults.fleet` ("study") and `faults.fleet_hardware` ("hardware"), and their
seed) and one table per experiment, each run as an ordinary study with its own database:

    rq1   lockstep replays with ABFT on every node: submodule mismatch, bursts, ABFT recall
    rq2   parameter-sync replays: per-step gradient noise-to-signal
    rq3   pretraining without sync, long enough to measure drift growth, with the golden node's
          shuffle-seed twin (the drift baseline), a trigger node (one single-ulp flip) and the
          golden run's sharpness at every checkpoint; then fine-tuning on the task ladder, with
          golden's fine-tune repeated under `[finetune] twins` shuffle seeds (the twin distribution)

Every model runs the experiments whose ``models`` name it (default: every one). The first
model's experiments record what the models share, once (golden, its twins, the healthy twin
node-00, the trigger); another model's record only its own nodes and diff them against those.

Layout of the output directory:

    profiles/           the first model's profile files (node-01.toml ...), trigger-ulp.toml and fleet.md;
                        another model's in profiles/<model>/
    rq1/ rq2/ rq3/      the first model's experiments, each a study folder (runs/, replays/, finetune/,
                        study.duckdb, report/), holding the shared runs
    <model>/rq1/ ...    another model's experiments: its nodes' runs and its own database
    reproduction.md     one row per finding of the study: its statement, ours, the query, the verdict, for
                        every model (a column per model, then each model's table)
    report/index.html   the reproduction tables, linking each experiment's report
    study.log, study-state.json   as for any study; --resume finishes an interrupted fleet study
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from faults.fleet import DEFAULT_SEED, MODELS, FleetSpec, trigger_profile_text, trigger_state_text
from faults.fleet_files import write_fleet
from sdc.study.folders import FLEET_FOLDER, PARTS
from sdc.study.runner import (
    Job,
    StudyPaths,
    StudyState,
    diff_into_db,
    file_fingerprint,
    plan_jobs,
    record_node,
    run_jobs,
)
from sdc.study.study_file import Finetune, FinetuneTable, Node, Study, build_study, is_fleet_file, shipped_studies
from tracer import typed_toml
from tracer.errors import ConfigError
from tracer.typed_toml import require, toml_field

HEALTHY = "healthy-node"  # the shipped profile of the healthy twin
HEALTHY_TWIN = "node-00"  # the healthy twin's label
TWIN, TRIGGER, GOLDEN = "golden-twin", "trigger-ulp", "golden"


@dataclass(frozen=True)
class _Fleet:
    nodes: int = toml_field(15, expected="an integer from 1 to 99")
    seed: int = toml_field(DEFAULT_SEED, expected="an integer >= 0")
    healthy_twin: bool = True  # a node-00 with the healthy-node profile in every experiment: every table shows 0
    models: tuple[str, ...] = toml_field(  # the fleet models the nodes are drawn from (faults.fleet.MODELS)
        ("study",),
        expected='a list of distinct fleet models: "study" (calibrated around the reference study), '
        '"hardware" (published measurements)',
    )

    def __post_init__(self) -> None:
        require(
            bool(self.models) and len(set(self.models)) == len(self.models) and all(m in MODELS for m in self.models),
            "models",
            list(self.models),
            typed_toml.expected(type(self), "models"),
        )
        require(1 <= self.nodes <= 99, "nodes", self.nodes, "an integer from 1 to 99")
        require(self.seed >= 0, "seed", self.seed, "an integer >= 0")


@dataclass(frozen=True)
class _Replayed:
    """rq1 and rq2: a model, a recorded window and the replay mode that answers the question."""

    config: str = toml_field(expected="a shipped workload config or a path")
    set: tuple[str, ...] = ()
    replay: str | None = toml_field(None, expected='"start:stop", the steps replayed (default: the first 8)')
    abft: bool = False  # every node (and the golden one) also checks every matmul
    models: tuple[str, ...] = toml_field(  # which of [fleet].models this experiment runs (empty: every one)
        (), expected="a list of models named in [fleet].models (empty: every one)"
    )


@dataclass(frozen=True)
class _Pretrain:
    """rq3: pretraining without sync, its baseline twin, the trigger node and the golden run's sharpness."""

    config: str = "tiny"
    set: tuple[str, ...] = ()
    shuffle_seed: int = toml_field(1, expected="an integer >= 0 other than the config's data.shuffle_seed")
    trigger_step: int = toml_field(20, expected="an integer >= 0 below run.steps")
    trigger_site: str = toml_field("layers.0.attention.wo", expected="the module path of a linear layer")
    trigger_parameter: str | None = toml_field(  # if given, the trigger flips one ulp of this parameter after the
        None, expected='a parameter name, e.g. "layers.0.attention.wo.weight"'
    )  # update (a [[state]] rule) instead
    sharpness: int = toml_field(20, expected="an integer >= 0: power iterations (0: sharpness not measured)")
    models: tuple[str, ...] = toml_field(  # which of [fleet].models this experiment runs (empty: every one)
        (), expected="a list of models named in [fleet].models (empty: every one)"
    )

    def __post_init__(self) -> None:
        require(self.trigger_step >= 0, "trigger_step", self.trigger_step, "an integer >= 0 below run.steps")
        require(self.sharpness >= 0, "sharpness", self.sharpness, "an integer >= 0")


@dataclass(frozen=True)
class _FleetFile:
    description: str = ""
    fleet: _Fleet = field(default_factory=_Fleet)
    rq1: _Replayed = field(default_factory=lambda: _Replayed("llama3-16l-mini"))
    rq2: _Replayed = field(default_factory=lambda: _Replayed("llama3-32l-mini"))
    rq3: _Pretrain = field(default_factory=_Pretrain)
    finetune: FinetuneTable = field(default_factory=FinetuneTable)


@dataclass(frozen=True)
class FleetStudy:
    """A fleet study file, read and checked; `parts` builds each experiment's study once profiles exist.

    Each of ``fleets`` (one per fault model, the same nodes and seed) runs the experiments that name its model. The
    first model's experiments are ``rq1`` ``rq2`` ``rq3`` and hold the runs every model shares (golden, its
    shuffle-seed twins, the healthy twin node-00, the trigger: `SHARED`); another model's are ``<model>/rq1`` ...,
    whose nodes are diffed against the shared runs, which are recorded once."""

    name: str
    source: Path
    description: str
    fleets: tuple[FleetSpec, ...]
    healthy_twin: bool
    rq1: _Replayed
    rq2: _Replayed
    rq3: _Pretrain
    finetune: Finetune | None
    overrides: tuple[str, ...] = ()  # --set: applied to every experiment's config

    @property
    def fingerprint(self) -> str:
        """What a resumed fleet study must share with the one that started: its file and overrides."""
        return file_fingerprint(self.source, self.overrides)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(f.model for f in self.fleets)

    def part_name(self, model: str, part: str) -> str:
        """The experiment's folder under the output: ``rq1`` for the first model, ``hardware/rq1`` for another."""
        return part if model == self.models[0] else f"{model}/{part}"

    def runs(self, model: str, part: str) -> bool:
        """Whether `model` runs experiment `part` (its table's ``models``, empty: every model)."""
        return model in (getattr(self, part).models or self.models)

    def profiles(self, root: Path, model: str) -> Path:
        """Where `model`'s profile files lie under ``root``: the first model's in it, another's in ``<model>/``."""
        return root if model == self.models[0] else root / model

    def shared(self) -> frozenset[str]:
        """The labels of the runs every model shares: golden, its twins, the healthy twin and the trigger."""
        twins = {label for label, _ in self.finetune.twin_labels(GOLDEN)} if self.finetune else set()
        return frozenset({GOLDEN, TWIN, HEALTHY_TWIN, TRIGGER, *twins})

    def parts(self, profiles: Path) -> dict[str, Study]:
        """Each model's experiments as studies whose nodes play the profiles under `profiles` (`write_profiles`),
        keyed by `part_name`."""
        out = {}
        for spec in self.fleets:
            first = spec.model == self.models[0]
            root = self.profiles(profiles, spec.model)
            fleet = [Node(f"node-{i:02d}", str(root / f"node-{i:02d}.toml")) for i in range(1, spec.nodes + 1)]
            twin = [Node(HEALTHY_TWIN, HEALTHY)] if self.healthy_twin else []
            for part, replayed, mode in (("rq1", self.rq1, "lockstep"), ("rq2", self.rq2, "param-sync")):
                if self.runs(spec.model, part):  # another model's replays need no control of their own
                    nodes = [Node(n.label, n.profile, abft=replayed.abft) for n in (twin if first else []) + fleet]
                    out[self.part_name(spec.model, part)] = self._study(
                        self.part_name(spec.model, part),
                        replayed.config,
                        replayed.set,
                        nodes,
                        replayed.replay,
                        (mode,),
                        None,
                        abft_golden=replayed.abft,
                    )
            if self.runs(spec.model, "rq3"):
                out[self.part_name(spec.model, "rq3")] = self._pretrain(spec.model, twin + fleet, profiles)
        return out

    def _pretrain(self, model: str, nodes: list[Node], profiles: Path) -> Study:
        trigger = Node(TRIGGER, str(profiles / f"{TRIGGER}.toml"))
        rq3 = self._study(
            self.part_name(model, "rq3"),
            self.rq3.config,
            self.rq3.set,
            nodes + [trigger],
            None,
            (),
            self.finetune,
            sharpness=self.rq3.sharpness,
        )
        shuffle = rq3.train.data.shuffle_seed
        if self.rq3.shuffle_seed == shuffle:
            raise ConfigError(
                f"{self.source}: rq3.shuffle_seed: {shuffle} is the config's own data.shuffle_seed; "
                "the baseline twin needs another one"
            )
        if self.rq3.trigger_step >= rq3.train.run.steps:
            raise ConfigError(
                f"{self.source}: rq3.trigger_step: {self.rq3.trigger_step} is not below the "
                f"{rq3.train.run.steps} recorded steps; choose an earlier step"
            )
        return rq3

    def _study(
        self,
        part: str,
        config: str,
        sets: tuple[str, ...],
        nodes: list[Node],
        replay: str | None,
        modes: tuple[str, ...],
        finetune: Finetune | None,
        *,
        abft_golden: bool = False,
        sharpness: int = 0,
    ) -> Study:
        return build_study(
            name=f"{self.name}/{part}",
            source=self.source,
            description=f"{self.description} ({part})",
            config=config,
            sets=tuple(sets) + self.overrides,
            golden=GOLDEN,
            abft_golden=abft_golden,
            nodes=nodes,
            replay_steps=replay,
            modes=modes,
            finetune=finetune,
            key=f"{part.rsplit('/', 1)[-1]}.",
            sharpness=sharpness,
        )

    def write_profiles(self, profiles: Path) -> list[Path]:
        """Every model's profile files and the trigger node's, as ordinary profile files a user can read and edit."""
        written = [p for spec in self.fleets for p in write_fleet(spec, self.profiles(profiles, spec.model))]
        trigger = profiles / f"{TRIGGER}.toml"
        rq3 = self.rq3
        text = (
            trigger_profile_text(rq3.trigger_step, rq3.trigger_site)
            if rq3.trigger_parameter is None
            else trigger_state_text(rq3.trigger_step, rq3.trigger_parameter)
        )
        trigger.write_text(text, encoding="utf-8")
        return [*written, trigger]


def load_fleet_study(spec: str | Path, overrides: tuple[str, ...] = ()) -> FleetStudy:
    """Load a shipped fleet study by name or a fleet study file by path, and check every experiment in it."""
    path = typed_toml.resolve(spec, shipped_studies(), "study")
    data = typed_toml.read(path)
    if not is_fleet_file(data):
        raise ConfigError(f"{path}: has no [fleet] table, so it is not a fleet study; run it with `sdc study`")
    f = typed_toml.from_dict(_FleetFile, data, str(path))
    for part in PARTS:
        named = getattr(f, part).models
        unknown = [m for m in named if m not in f.fleet.models]
        if unknown:
            raise ConfigError(
                f"{path}: {part}.models: {', '.join(unknown)} not in [fleet].models ({', '.join(f.fleet.models)})"
            )
        if named and f.fleet.models[0] not in named:
            raise ConfigError(
                f"{path}: {part}.models: must name {f.fleet.models[0]}, the first of [fleet].models, "
                "whose experiments record the runs every model shares (golden, its twins)"
            )
    study = FleetStudy(
        name=path.name.removesuffix(".toml"),
        source=path,
        description=f.description,
        fleets=tuple(FleetSpec(nodes=f.fleet.nodes, seed=f.fleet.seed, model=m) for m in f.fleet.models),
        healthy_twin=f.fleet.healthy_twin,
        rq1=f.rq1,
        rq2=f.rq2,
        rq3=f.rq3,
        finetune=f.finetune.plan(),
        overrides=tuple(overrides),
    )
    with tempfile.TemporaryDirectory() as scratch:  # every experiment checked before anything runs
        study.write_profiles(Path(scratch))
        study.parts(Path(scratch))
    return study


@dataclass(frozen=True)
class FleetPaths:
    out: Path
    shared: frozenset[str] = frozenset()  # labels of the runs the first model's experiments hold for every model

    def part(self, name: str) -> StudyPaths:
        """An experiment's folder (`FleetStudy.part_name`); another model's reads the shared runs from the first's."""
        model, _, part = name.rpartition("/")
        if not model:
            return StudyPaths(self.out / name)
        return StudyPaths(self.out / name, borrowed=StudyPaths(self.out / part), shared=self.shared)

    @property
    def profiles(self) -> Path:
        return self.out / "profiles"

    @property
    def reproduction(self) -> Path:
        return self.out / "reproduction.md"

    @property
    def report(self) -> Path:
        return self.out / "report"


@dataclass(frozen=True)
class FleetResult:
    paths: FleetPaths
    parts: dict[str, Study]
    wall_s: float


def run_fleet_study(
    fleet: FleetStudy,
    out: Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    beam_args: tuple[str, ...] = (),
) -> FleetResult:
    """Run every job of every experiment, then the reproduction table; see the module docstring."""
    paths = FleetPaths(Path(out), shared=fleet.shared())
    state = StudyState(paths.out, fleet.name, fleet.fingerprint, FLEET_FOLDER)
    lock, finished = state.claim(overwrite=overwrite, resume=resume)
    with lock:
        fleet.write_profiles(paths.profiles)  # deterministic: a resumed study writes the same bytes again
        parts = fleet.parts(paths.profiles)
        jobs = plan_fleet_jobs(fleet, parts, paths, progress=progress, beam_args=beam_args)
        return FleetResult(paths, parts, run_jobs(jobs, state, finished, progress=progress))


def plan_fleet_jobs(
    fleet: FleetStudy, parts: dict[str, Study], paths: FleetPaths, *, progress: bool, beam_args: tuple[str, ...]
) -> list[Job]:
    """Every job of every model's experiments, in order (the shared runs once, in the first model's), then the
    reproduction table."""
    jobs: list[Job] = []
    for name, study in parts.items():
        part_paths = paths.part(name)
        part_jobs = plan_jobs(study, part_paths, progress=progress, beam_args=beam_args)
        if name.endswith("rq3"):
            part_jobs = _with_baseline(fleet, study, part_paths, part_jobs, progress, beam_args)
        jobs += [
            Job(f"{name}/{j.name}", f"{name}: {j.describe}", j.action)
            for j in part_jobs
            if part_paths.writes(j) and j.name not in _UNUSED
        ]
    dbs = {
        model: {
            part: (paths.part(fleet.part_name(model, part)).db if fleet.runs(model, part) else None) for part in PARTS
        }
        for model in fleet.models
    }
    jobs.append(Job("reproduction", "reproduction table", lambda: _reproduction(dbs, paths)))
    return jobs


# The trigger's fine-tune answers no finding (rows 13-15 judge the fleet's nodes against golden's twins; the trigger
# tests drift growth in pretraining, row 10), and costs one fine-tune and one diff of the budget.
_UNUSED = frozenset({f"finetune:{TRIGGER}", f"diff-finetune:{TRIGGER}"})


def _with_baseline(
    fleet: FleetStudy, study: Study, paths: StudyPaths, jobs: list[Job], progress: bool, beam_args: tuple[str, ...]
) -> list[Job]:
    """rq3's jobs with the golden run's shuffle-seed twin recorded after golden and diffed as the baseline pair."""
    seed = fleet.rq3.shuffle_seed
    train = dataclasses.replace(study.train, data=dataclasses.replace(study.train.data, shuffle_seed=seed))
    twin = dataclasses.replace(study, train=train, sharpness=0)
    record = Job(
        f"record:{TWIN}",
        f"record {TWIN} (healthy, data shuffle seed {seed})",
        lambda: record_node(twin, paths.run(TWIN), TWIN, None, 0, False, progress),
    )
    diff = Job(
        f"diff:{TWIN}",
        f"diff {GOLDEN} vs {TWIN} (the drift baseline)",
        lambda: diff_into_db(paths.run(GOLDEN), paths.run(TWIN), [], paths.db, beam_args, baseline=True),
    )
    first_diff = next(i for i, j in enumerate(jobs) if j.name.startswith("diff:"))
    return [jobs[0], record, *jobs[1:first_diff], diff, *jobs[first_diff:]]


def _reproduction(dbs: dict[str, dict[str, Path | None]], paths: FleetPaths) -> str:
    from analysis.reproduction import build_reproduction, write_reproduction

    reproductions = {model: build_reproduction(parts) for model, parts in dbs.items()}
    reports = {
        (model, part): db.parent / "report"
        for model, parts in dbs.items()
        for part, db in parts.items()
        if db is not None
    }
    write_reproduction(reproductions, paths.reproduction, paths.report, reports)
    return (
        "; ".join(f"{model}: {rep.totals()}" for model, rep in reproductions.items())
        + f"; {paths.reproduction.name} written"
    )
