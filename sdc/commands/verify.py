"""``sdc verify-determinism``: record the same config twice and compare bit for bit; with ``--report``, the
nondeterminism audit (every place whose bits differ, with ulp distances) and its tolerance map."""

from __future__ import annotations

import argparse
from pathlib import Path

from sdc.commands import Command
from sdc.commands._common import (
    add_config_options,
    add_device_option,
    add_parallel_options,
    add_workload_option,
    config_from_args,
)
from tracer.errors import UsageError


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Record the same config (of the reference workload or yours, with --workload) twice in this environment "
            "and compare every fingerprint. "
            "Run it before trusting a pair of runs: SDC detection assumes healthy runs are identical. "
            "With --report FILE, audit instead: list every site, gradient, parameter and collective whose bits "
            "differ, with ulp distances (the two recordings keep the audited steps' full tensors), print the table "
            "and write the tolerance map `sdc diff --tolerance` reads; or audit two runs that exist (RUN_A RUN_B, "
            "two runs of one node: ulps where both kept a tensor, else the l2/absmax stats' relative difference). "
            "Exit status 0: bit-identical; 1: the first differing event is printed (with --report: the places)."
        ),
    )
    p.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="with --report: two existing runs to audit instead of recording the config twice",
    )
    add_workload_option(p)
    add_config_options(p)
    add_device_option(p)
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep the two runs in DIR/a and DIR/b")
    p.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="audit every differing place and write the tolerance map (JSON) to FILE (docs/incident.md)",
    )
    p.add_argument(
        "--capture-steps",
        metavar="LIST",
        help="with --report: the steps whose full tensors both "
        "recordings keep for ulp distances, e.g. 0,5 (default: every step)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=2.0,
        metavar="X",
        help="with --report: the map's bands are X times the measured one (default 2, at least 1)",
    )
    add_parallel_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.runs and (args.report is None or len(args.runs) != 2):
        raise UsageError(
            f"RUN arguments: give two runs with --report (found {len(args.runs)}"
            f"{'' if args.report else ', no --report'}), or none to record the config twice"
        )
    if args.report is not None:
        return _report(args)
    from jobs.verify import verify_determinism
    from workload.protocol import REFERENCE

    config, n = config_from_args(args)
    result = verify_determinism(
        config,
        workload=args.workload or REFERENCE,
        device=args.device,
        nproc=n,
        rank_timeout=args.rank_timeout,
        keep=args.keep,
        progress=not args.quiet,
    )
    if result.first is None:
        print(
            f"bit-identical: {result.events:,} tensor events over {result.steps} steps"
            + (f" on {n} ranks" if n > 1 else "")
        )
        return 0
    print(f"NOT deterministic: first difference at {result.first.describe()}")
    return 1


def _report(args: argparse.Namespace) -> int:
    import tempfile

    from pipelines.nondeterminism import audit_runs, audit_table
    from pipelines.tolerance import MAX_MARGIN, write_tolerance_map

    if not 1.0 <= args.margin <= MAX_MARGIN:
        raise UsageError(f"--margin {args.margin}: expected a number in 1..{MAX_MARGIN:g}")
    if args.report.is_dir():  # refused before the audit runs, not when the map is written after it
        raise UsageError(
            f"--report {args.report}: is a directory; name the tolerance map's file, e.g. "
            f"{args.report / 'tolerance.json'}"
        )
    with tempfile.TemporaryDirectory(prefix="sdc-audit-") as tmp:
        if args.runs:
            a, b = map(Path, args.runs)
        else:
            a, b = _record_twice(args, Path(tmp))
        audit = audit_runs(a, b, margin=args.margin)
    for line in audit_table(audit):
        print(line)
    write_tolerance_map(args.report, audit.tolerance)
    print(
        f"tolerance map: {args.report} ({len(audit.places)} place(s)); use it with sdc diff --tolerance {args.report}"
    )
    return 0 if not audit.places and audit.misaligned is None else 1


def _record_twice(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    """Record the config twice (in --keep or ``tmp``), keeping the audited steps' full tensors."""
    from jobs.verify import verify_determinism
    from tracer.options import CapturePolicy, TraceOptions
    from workload.protocol import REFERENCE

    capture = CapturePolicy(every=1)
    if args.capture_steps is not None:
        words = [w.strip() for w in args.capture_steps.split(",") if w.strip()]
        if not all(w.isdigit() for w in words):
            raise UsageError(f"--capture-steps {args.capture_steps!r}: expected step numbers such as 0,5")
        capture = CapturePolicy(steps=frozenset(map(int, words)))
    config, n = config_from_args(args)
    root = args.keep or tmp
    verify_determinism(
        config,
        workload=args.workload or REFERENCE,
        device=args.device,
        nproc=n,
        rank_timeout=args.rank_timeout,
        keep=root,
        progress=not args.quiet,
        trace=TraceOptions(capture=capture),
    )
    return root / "a", root / "b"
