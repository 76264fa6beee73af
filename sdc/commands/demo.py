"""``sdc demo``: the whole study on the embedded default, in about ten minutes on a laptop."""

from __future__ import annotations

import argparse

from sdc.commands import Command
from sdc.commands.study import add_study_options, run_loaded


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Run the shipped `demo` study on the tiny workload and the embedded corpus: record a golden node, "
            "a healthy twin and three unhealthy nodes emulated by different fault profiles (one of them recorded "
            "a second time under the guard), replay a window of steps in both modes, diff everything into one "
            "DuckDB database, fine-tune every node on the shipped multiple-choice tasks, print the RQ1-RQ3 "
            "summary tables and the guard's detector scores and write the HTML report. "
            "`sdc study demo` is the same; copy its file (sdc/study/studies/demo.toml) to make your own."
        ),
    )
    add_study_options(p, default_out="demo")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sdc.study.study_file import load_study

    return run_loaded(load_study("demo", tuple(args.overrides)), args)
