"""``sdc verify-determinism``: record the same config twice and compare bit for bit."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sdc.commands._common import (
    add_config_options,
    add_device_option,
    add_parallel_options,
    config_from_args,
    launch_ranks,
    ranks,
)
from sdc.commands.record import record_rank
from tracer.compare import compare_runs
from tracer.options import TraceOptions


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify-determinism",
        help="run a config twice and check the two runs are bit-identical",
        description=(
            "Record the same config twice in this environment and compare every fingerprint. "
            "Run it before trusting a pair of runs: SDC detection assumes healthy runs are identical. "
            "Exit status 0: bit-identical; 1: the first differing event is printed."
        ),
    )
    add_config_options(p)
    add_device_option(p)
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep the two runs in DIR/a and DIR/b")
    add_parallel_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    with tempfile.TemporaryDirectory(prefix="sdc-verify-") as tmp:
        root = args.keep or Path(tmp)
        for name in ("a", "b"):
            job = {"out": str(root / name), "node_label": f"verify-{name}", "overwrite": True,
                   "trace": TraceOptions().to_dict(), "progress": not args.quiet, "fault_profile": None, "device": args.device}
            if ranks(cfg) == 1:
                record_rank(cfg, **job)
            else:
                launch_ranks(args, "sdc.commands.record:record_rank", cfg, job)
        result = compare_runs(root / "a", root / "b")
    if result.first is None:
        n = ranks(cfg)
        print(f"bit-identical: {result.events:,} tensor events over {result.steps} steps"
              + (f" on {n} ranks" if n > 1 else ""))
        return 0
    print(f"NOT deterministic: first difference at {result.first.describe()}")
    return 1
