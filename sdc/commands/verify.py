"""``sdc verify-determinism``: record the same config twice and compare bit for bit."""

from __future__ import annotations

import argparse
from pathlib import Path

from jobs.verify import verify_determinism
from sdc.commands import Command
from sdc.commands._common import (
    add_config_options,
    add_device_option,
    add_parallel_options,
    add_workload_option,
    config_from_args,
)
from workload.protocol import REFERENCE


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Record the same config (of the reference workload or yours, with --workload) twice in this environment and compare every fingerprint. "
            "Run it before trusting a pair of runs: SDC detection assumes healthy runs are identical. "
            "Exit status 0: bit-identical; 1: the first differing event is printed."
        ),
    )
    add_workload_option(p)
    add_config_options(p)
    add_device_option(p)
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep the two runs in DIR/a and DIR/b")
    add_parallel_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config, n = config_from_args(args)
    result = verify_determinism(config, workload=args.workload or REFERENCE, device=args.device, nproc=n,
                                rank_timeout=args.rank_timeout, keep=args.keep, progress=not args.quiet)
    if result.first is None:
        print(f"bit-identical: {result.events:,} tensor events over {result.steps} steps"
              + (f" on {n} ranks" if n > 1 else ""))
        return 0
    print(f"NOT deterministic: first difference at {result.first.describe()}")
    return 1
