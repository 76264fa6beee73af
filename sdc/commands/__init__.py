"""Sub-commands of ``sdc``: `COMMANDS` names each one, its module and its one-line help, in the order
``sdc --help`` lists them.

A command's module has ``add_parser(subparsers, command)``, which adds the command's parser (named
``command.name``, with ``command.help``) and its handler, and imports what the command runs (torch, Beam,
DuckDB) only when the handler runs. The one-line help lives here, so ``sdc --help`` lists every command without
importing a command's module: ``Command.add_stub`` adds the name and help alone, ``Command.add_parser`` the
whole parser (sdc/cli.py builds the whole one of the command being run only).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str  # as typed after `sdc`
    module: str  # the module with its add_parser and handler
    help: str  # the line `sdc --help` shows

    def add_parser(self, sub: argparse._SubParsersAction) -> None:
        """The command's whole parser: its options, help text and handler."""
        importlib.import_module(self.module).add_parser(sub, self)

    def add_stub(self, sub: argparse._SubParsersAction) -> None:
        """The command's name and one-line help alone: what `sdc --help` shows of it."""
        sub.add_parser(self.name, help=self.help)


COMMANDS = (
    Command("record", "sdc.commands.record", "train and record a fingerprinted run"),
    Command("inspect", "sdc.commands.inspect", "summarise a recorded run"),
    Command("verify-determinism", "sdc.commands.verify", "run a config twice and check the two runs are bit-identical"),
    Command(
        "replay", "sdc.commands.replay", "replay steps of a golden run on a suspect executor (param-sync or lockstep)"
    ),
    Command(
        "incident",
        "sdc.commands.incident",
        "capture a divergent site into a bundle for the vendor (reproduce.py, safetensors, defect signature)",
    ),
    Command(
        "faults", "sdc.commands.faults", "list or print the shipped fault profiles, or draw a fleet of unhealthy nodes"
    ),
    Command("diff", "sdc.commands.diff", "diff a pair of runs into a DuckDB study database (an Apache Beam job)"),
    Command(
        "certify",
        "sdc.commands.certify",
        "name the last checkpoint of a run that matched a golden run (or its replicas), to resume from",
    ),
    Command(
        "watch", "sdc.commands.watch", "compare two runs while they are recorded and report their first divergence live"
    ),
    Command("finetune", "sdc.commands.finetune", "fine-tune a recorded run on multiple-choice QA tasks, traced"),
    Command("query", "sdc.commands.query", "run a named query (RQ1-RQ3, summary) or one SELECT on a study database"),
    Command("report", "sdc.commands.report", "write PNG plots and an index.html of a study database"),
    Command(
        "study",
        "sdc.commands.study",
        "run a whole study from a study file (nodes, fault profiles, model, replay window, fine-tuning)",
    ),
    Command(
        "demo",
        "sdc.commands.demo",
        "run the shipped demo study: a golden node and four emulated ones, end to end, no download",
    ),
)
