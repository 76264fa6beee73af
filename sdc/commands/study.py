"""``sdc study CONFIG``: run a whole study (record, replay, diff, fine-tune, report) from a study file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sdc.commands import Command

if TYPE_CHECKING:
    from sdc.study.fleet_study import FleetStudy
    from sdc.study.study_file import Study


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    from sdc.study.study_file import shipped_studies

    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Run the RQ1-RQ3 study a study file describes: record the golden node and every emulated node, "
            "replay the study's window in lockstep and param-sync mode, diff every node against the golden one "
            "into one DuckDB database, fine-tune each node's final model (and a shuffle-seed twin of the golden "
            "one), print the summary tables and write the report. Shipped studies: "
            f"{', '.join(shipped_studies())}."
        ),
        epilog="Copy sdc/study/studies/demo.toml to start a study file of your own.",
    )
    p.add_argument("study", metavar="CONFIG", help="a shipped study name or a path to a study TOML file")
    add_study_options(p, default_out=None)
    p.set_defaults(handler=run)


def add_study_options(p: argparse.ArgumentParser, default_out: str | None) -> None:
    where = f"default: ./{default_out}" if default_out else "default: ./<study name>"
    p.add_argument("--out", type=Path, metavar="DIR", default=default_out, help=f"output directory ({where})")
    p.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one value of the study's training config, e.g. --set run.steps=20 (repeatable)",
    )
    again = p.add_mutually_exclusive_group()
    again.add_argument("--overwrite", action="store_true", help="replace a study already in --out")
    again.add_argument(
        "--resume", action="store_true", help="finish a study that stopped: skip the jobs it finished, redo the rest"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from sdc.study.fleet_study import is_fleet_file, load_fleet_study
    from sdc.study.study_file import load_study, shipped_studies
    from tracer import typed_toml

    path = typed_toml.resolve(args.study, shipped_studies(), "study")
    if is_fleet_file(typed_toml.read(path)):
        return run_fleet(load_fleet_study(path, tuple(args.overrides)), args)
    return run_loaded(load_study(path, tuple(args.overrides)), args)


def run_fleet(fleet: FleetStudy, args: argparse.Namespace) -> int:
    from sdc.study.fleet_study import run_fleet_study

    out = args.out if args.out is not None else Path(fleet.name)
    print(f"fleet study {fleet.name}: {fleet.description or fleet.source}")
    print(
        f"  {fleet.fleets[0].nodes} unhealthy nodes from each fleet model ({', '.join(fleet.models)}; "
        f"seed {fleet.fleets[0].seed}); experiments "
        f"rq1 ({fleet.rq1.config}, lockstep), rq2 ({fleet.rq2.config}, param-sync), rq3 ({fleet.rq3.config}, "
        f"pretraining{' and fine-tuning' if fleet.finetune else ''}); output in {out}/"
    )
    result = run_fleet_study(fleet, out, overwrite=args.overwrite, resume=args.resume, progress=not args.quiet)
    print()
    print(result.paths.reproduction.read_text(encoding="utf-8"))
    print(f"fleet study {fleet.name} finished in {result.wall_s / 60:.1f} min; each job's output is in {out}/study.log")
    for part in result.parts:
        print(f"  {part}: database {result.paths.part(part).db}, report {result.paths.part(part).report}/index.html")
    print(f"  reproduction: {result.paths.reproduction} and {result.paths.report}/index.html")
    return 0


def run_loaded(study: Study, args: argparse.Namespace) -> int:
    from sdc.study.runner import run_study, summary_tables

    out = args.out if args.out is not None else Path(study.name)
    nodes = ", ".join(f"{n.label} ({n.profile})" for n in study.nodes)
    print(f"study {study.name}: {study.description or study.source}")
    print(f"  golden {study.golden}; nodes {nodes}; {study.train.run.steps} steps; output in {out}/")
    result = run_study(study, out, overwrite=args.overwrite, resume=args.resume, progress=not args.quiet)
    for title, text in summary_tables(result.paths.db):
        print(f"\n{title}\n{text}")
    db = result.paths.db
    print(f"\nstudy {study.name} finished in {result.wall_s / 60:.1f} min; each job's output is in {out}/study.log")
    print(f"  database: {db}\n  report:   {result.paths.report / 'index.html'}")
    print("next, try:")
    print("  sdc query --list")
    print(f"  sdc query rq1_mismatch_by_site --db {db}")
    print(f"  sdc query rq3_drift_and_loss --db {db} --format csv")
    print(f'  sdc query --sql "SELECT * FROM first_divergence" --db {db}')
    return 0
