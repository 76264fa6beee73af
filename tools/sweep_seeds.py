"""Verdicts across fleet seeds: the reproduction table's RQ1 rows, recorded and judged for many seeds of every model.

    python tools/sweep_seeds.py                       # `make sweep-seeds`: fleet-mini's RQ1, seeds 1-20, both models
    python tools/sweep_seeds.py --seeds 1:4 --study fleet-mini --out /tmp/sweep

A fleet study judges its rows on one fleet seed (fleet: 1, fleet-mini: 4). This script asks how much a verdict owes
to that seed: for each seed it draws every model's fleet (`faults.fleet_files.write_fleet`, the study's own files),
runs the study's RQ1 experiment on it exactly as `sdc study` does (each node recorded with its profile and ABFT,
replayed in lockstep against golden, diffed into a DuckDB database) and judges the RQ1 rows with the study's own
rules and recovery (`analysis.reproduction.build_reproduction`). It prints, per model and row, the shipped seed's
verdict beside "consistent in k of n seeds", and one mark per seed.

The RQ1 rows cannot be computed from the drawn profiles alone: whether a node is silent or frequent, how small its
mismatches are and how far its worst element is off are measured at the submodules (lockstep), and ABFT's recall
needs the recording. What is saved against a whole fleet study: golden is recorded once for every seed (its run
does not depend on the fleet seed; every seed's nodes are diffed against it, as a second model's are in the study),
and no healthy twin, RQ2, RQ3 or HTML report is run. Each seed's folder is kept under ``--out`` (default: a
temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from analysis.reproduction import FINDINGS, Reproduction, build_reproduction  # noqa: E402
from sdc.study.fleet_study import GOLDEN, FleetStudy, load_fleet_study  # noqa: E402
from sdc.study.runner import Job, StudyPaths, plan_jobs  # noqa: E402
from tracer.errors import ConfigError, SdcError  # noqa: E402

RQ1 = tuple(i for i, f in enumerate(FINDINGS) if f.level == "RQ1")  # the RQ1 rows' indices in the table
MARKS = {"reproduced": "+", "not reproduced": "-", "different": "d", "not measured": "."}  # one per seed and row


@dataclass(frozen=True)
class SeedResult:
    seed: int
    model: str
    rep: Reproduction  # the RQ1 rows judged; the other parts not run
    cpu_s: float  # user + system CPU seconds of the seed's jobs (this process and its children)


@dataclass(frozen=True)
class Sweep:
    study: str
    nodes: int  # per model
    shipped: int  # the study file's own seed
    seeds: tuple[int, ...]
    models: tuple[str, ...]
    results: tuple[SeedResult, ...]
    golden_cpu_s: float

    def result(self, model: str, seed: int) -> SeedResult:
        return next(r for r in self.results if r.model == model and r.seed == seed)

    def outcomes(self, model: str, row: int) -> list[str]:
        """The row's outcome at each seed, in `seeds` order (the rule's words: reproduced, not reproduced ...)."""
        return [self.result(model, s).rep.rows[row].verdict.outcome for s in self.seeds]

    def consistent(self, model: str, row: int) -> int:
        """Seeds at which the row's verdict is consistent with the study (its rule holds)."""
        return self.outcomes(model, row).count("reproduced")

    def unstable(self, model: str, row: int) -> int:
        """Seeds at which the row's number lies within its rule's margin of the threshold."""
        return sum(bool(self.result(model, s).rep.rows[row].verdict.unstable) for s in self.seeds)


def parse_seeds(text: str) -> tuple[int, ...]:
    """The seeds of "1:21" (start:stop, stop excluded) or "1,4,7"."""
    try:
        if ":" in text:
            start, stop = (int(x) for x in text.split(":"))
            seeds = tuple(range(start, stop))
        else:
            seeds = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f'--seeds: expected "start:stop" or "1,4,7", not {text!r}') from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected distinct integers >= 0, not {text!r}")
    return seeds


def at_seed(study: FleetStudy, seed: int) -> FleetStudy:
    """The study with every model's fleet drawn from `seed`, and no healthy twin (the RQ1 rows read fleet nodes
    only)."""
    fleets = tuple(dataclasses.replace(f, seed=seed) for f in study.fleets)
    return dataclasses.replace(study, fleets=fleets, healthy_twin=False)


def with_nodes(study: FleetStudy, nodes: int) -> FleetStudy:
    """The study with `nodes` nodes per model instead of its file's (fleet-mini's RQ1 at the full fleet's 15)."""
    return dataclasses.replace(study, fleets=tuple(dataclasses.replace(f, nodes=nodes) for f in study.fleets))


def sweep(study: FleetStudy, seeds: tuple[int, ...], out: Path, models: tuple[str, ...] = ()) -> Sweep:
    """Record, replay, diff and judge the RQ1 rows of `models` (empty: every model of `study` that runs RQ1) at each of
    `seeds`, under `out`."""
    unknown = [m for m in models if not study.runs(m, "rq1")]
    if unknown:
        raise ConfigError(f"--models: {', '.join(unknown)} not among the models that run rq1 in {study.source}")
    models = models or tuple(m for m in study.models if study.runs(m, "rq1"))
    golden = StudyPaths(out / "golden")
    shared = frozenset({GOLDEN})
    golden_cpu: float | None = None  # recorded once, by the first part, for every seed and model
    results = []
    for seed in seeds:
        fleet = at_seed(study, seed)
        profiles = out / f"seed-{seed:03d}" / "profiles"
        fleet.write_profiles(profiles)
        parts = fleet.parts(profiles)
        for model in models:
            part = parts[fleet.part_name(model, "rq1")]
            if golden_cpu is None:
                jobs = plan_jobs(part, golden, progress=False, beam_args=())
                golden_cpu = _run([j for j in jobs if j.name == f"record:{GOLDEN}"], out / "sweep.log")
            paths = StudyPaths(out / f"seed-{seed:03d}" / model, borrowed=golden, shared=shared)
            jobs = [j for j in plan_jobs(part, paths, progress=False, beam_args=()) if paths.writes(j)]
            cpu = _run([j for j in jobs if j.name != "report"], out / "sweep.log")
            rep = build_reproduction({"rq1": paths.db, "rq2": None, "rq3": None})
            results.append(SeedResult(seed, model, rep, cpu))
    nodes, shipped = study.fleets[0].nodes, study.fleets[0].seed
    return Sweep(study.name, nodes, shipped, seeds, models, tuple(results), golden_cpu or 0.0)


def _run(jobs: list[Job], log: Path) -> float:
    """Run `jobs` in order, what they print going to `log`; their CPU seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = _cpu()
    with open(log, "a", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        for job in jobs:
            f.write(f"\n== {job.describe} ==\n")
            f.write(job.action() + "\n")
    return _cpu() - start


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def table(s: Sweep) -> str:
    """The sweep as Markdown: per model and RQ1 row, the shipped seed's verdict, consistent in k of n seeds, how
    many seeds were unstable, and one mark per seed (+ consistent, - not, . not measured, d different)."""
    n = len(s.seeds)
    shipped = s.shipped in s.seeds
    lines = [
        f"RQ1 rows of `{s.study}` ({s.nodes} nodes per model) over fleet seeds {_span(s.seeds)} ({n} seeds; the "
        f"study ships seed {s.shipped})",
        "",
        f"| model | # | the study | seed {s.shipped} | consistent in | unstable in | per seed ({_span(s.seeds)}) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in s.models:
        for row in RQ1:
            words = s.result(model, s.shipped).rep.rows[row].outcome if shipped else "not swept"
            marks = "".join(MARKS[o] for o in s.outcomes(model, row))
            lines.append(
                f"| {model} | {row + 1} | {FINDINGS[row].study} | {words} | {s.consistent(model, row)} of {n} seeds "
                f"| {s.unstable(model, row)} of {n} | `{marks}` |"
            )
    cpu = sum(r.cpu_s for r in s.results)
    lines += [
        "",
        f"Marks: + consistent, - not consistent, . not measured, d different. CPU: golden {s.golden_cpu_s:.0f} s once, "
        f"then {cpu / len(s.results):.0f} s per seed and model ({cpu + s.golden_cpu_s:.0f} s in all).",
    ]
    return "\n".join(lines) + "\n"


def _span(seeds: tuple[int, ...]) -> str:
    if seeds == tuple(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="fleet-mini", help="a shipped fleet study or a path (default fleet-mini)")
    parser.add_argument("--seeds", default="1:21", help='"start:stop" (stop excluded) or "1,4,7" (default 1:21)')
    parser.add_argument("--nodes", type=int, default=None, help="nodes per model (default: the study file's)")
    parser.add_argument("--models", default="", help="comma-separated fault models (default: every one running rq1)")
    parser.add_argument("--out", type=Path, default=None, help="keep every seed's folder here (default: temporary)")
    args = parser.parse_args(argv)
    try:
        study, seeds = load_fleet_study(args.study), parse_seeds(args.seeds)
        models = tuple(m for m in args.models.split(",") if m)
        if args.nodes is not None:
            study = with_nodes(study, args.nodes)
        if args.out is not None:
            if args.out.exists() and any(args.out.iterdir()):
                raise ConfigError(f"--out: {args.out} is not empty; name a new folder")
            print(table(sweep(study, seeds, args.out, models)), end="")
        else:
            with tempfile.TemporaryDirectory(prefix="sweep-seeds-") as tmp:
                print(table(sweep(study, seeds, Path(tmp), models)), end="")
    except SdcError as e:
        print(f"sweep-seeds: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
