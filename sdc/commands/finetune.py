"""``sdc finetune``: fine-tune a recorded run on the multiple-choice tasks, traced (RQ3)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from faults import load_profile, shipped_profiles
from jobs.finetune import finetune_run
from sdc.commands import Command
from sdc.commands._common import seed
from workload.multiple_choice import FinetuneSettings
from workload.tasks import TASK_NAMES


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    d = FinetuneSettings()
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Load the final checkpoint of a run made by `sdc record` and fine-tune it on the multiple-choice "
            "tasks that ship with sdctrace (generated, no download), tracing every step like `sdc record`. "
            "Each task's test split is answered before the first step, every few steps and after the last; "
            "every answer is logged. Fine-tune the same run on each node and once more on the golden node "
            "with another --shuffle-seed (the twin), then `sdc diff --golden G --suspect S --twin T` "
            "(docs/finetune.md)."
        ),
    )
    p.add_argument(
        "--from",
        dest="pretrained",
        required=True,
        type=Path,
        metavar="RUN",
        help="the pretraining run directory (its final checkpoint is the starting point)",
    )
    p.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="run directory to create, e.g. runs/golden-ft"
    )
    p.add_argument(
        "--node-label", default=socket.gethostname(), metavar="L", help="name of the node (default: this host's name)"
    )
    p.add_argument(
        "--shuffle-seed",
        type=seed,
        default=d.shuffle_seed,
        metavar="N",
        help=f"order of the training examples (default {d.shuffle_seed}); another value makes a twin",
    )
    p.add_argument("--steps", type=int, default=d.steps, metavar="N", help=f"optimizer steps (default {d.steps})")
    p.add_argument(
        "--tasks",
        default=",".join(d.tasks),
        metavar="A,B",
        help=f"comma-separated tasks from {','.join(TASK_NAMES)} (default: the ladder {','.join(d.tasks)}, "
        "easiest first)",
    )
    p.add_argument(
        "--fault-profile",
        metavar="PROFILE",
        help=f"fine-tune as an emulated unhealthy node: a shipped fault profile "
        f"({', '.join(shipped_profiles())}) or a path to a TOML file",
    )
    p.add_argument("--fault-seed", type=seed, default=0, metavar="S", help="seed of the emulated faults")
    p.add_argument("--overwrite", action="store_true", help="replace a run that already exists in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    summary = finetune_run(
        args.pretrained,
        args.out,
        node_label=args.node_label,
        settings=FinetuneSettings(
            shuffle_seed=args.shuffle_seed,
            steps=args.steps,
            tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()),
        ),
        fault_profile=load_profile(args.fault_profile) if args.fault_profile is not None else None,
        fault_seed=args.fault_seed,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    print(
        f"fine-tuned {summary.steps} steps to {summary.out} (final loss {summary.losses[-1]:.4f}, "
        f"{summary.wall_s:.1f} s); test accuracy after the last step:"
    )
    for e in summary.final:
        flag = "  COLLAPSED (no better than chance)" if e.collapsed else ""
        print(f"  {e.task:<10} {e.accuracy:6.1%}  ({e.correct}/{e.examples}, chance {e.chance:.0%}){flag}")
    return 0
