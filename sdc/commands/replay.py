"""``sdc replay``: re-run recorded steps with golden state injected (parameter sync or lockstep).

The command parses its arguments, builds the `ReplayRequest` and prints what the replay job (jobs/replay.py)
returns; the job claims the output directory and runs or launches the ranks."""

from __future__ import annotations

import argparse
from pathlib import Path

from jobs.replay import golden_header, replay
from replay.request import MODES, ReplayRequest, parse_steps, suspect_from_profile, suspect_from_run
from sdc.commands import Command
from sdc.commands._common import seed
from tracer.compare import compare_runs, ranks_without_steps
from tracer.errors import UsageError


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Rebuild steps of a recorded golden run (the reference workload's, or any other through --workload) "
            "from its checkpoints (verifying every fingerprint) and run "
            "them on the suspect executor: this machine, emulating the suspect run's fault profile if it had one, "
            "or a fault profile given here. param-sync starts each step from the golden parameters and compares "
            "gradients (RQ2 noise-to-signal); lockstep also compares every site's output and input gradient with "
            "the golden one and overwrites it, isolating each site's own error (RQ1 mismatch frequency/severity). "
            "The results are a replay log for `sdc diff --replay`. A multi-rank golden run is replayed by as many "
            "ranks on this machine, each with its own shard, checkpoints and log."
        ),
    )
    p.add_argument("--golden", required=True, type=Path, metavar="RUN", help="the healthy run (with checkpoints)")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--suspect", type=Path, metavar="RUN", help="the suspect node's recorded run (must pair with --golden)"
    )
    who.add_argument(
        "--fault-profile", metavar="PROFILE", help="emulate a node with this fault profile (see `sdc faults list`)"
    )
    p.add_argument("--fault-seed", type=seed, default=0, metavar="S", help="seed for --fault-profile (default 0)")
    p.add_argument("--steps", metavar="A:B", help="steps to replay, stop exclusive (e.g. 10:20) or one step")
    p.add_argument(
        "--at-first-divergence",
        action="store_true",
        help="replay around the first step where --golden and --suspect differ (instead of --steps)",
    )
    p.add_argument("--window", type=int, default=1, metavar="N", help="with --at-first-divergence: N steps either side")
    p.add_argument(
        "--mode", choices=MODES, default="lockstep", help="param-sync (RQ2) or lockstep (RQ1); default lockstep"
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for the replay log")
    p.add_argument(
        "--golden-from",
        choices=("auto", "blobs", "reexec"),
        default="auto",
        help="golden tensors: captured blobs where present (auto), blobs only, or re-execution only",
    )
    p.add_argument(
        "--workload",
        metavar="MODULE:FACTORY",
        help="the factory that rebuilds the golden run (package.module:function; docs/own-training.md); "
        "needed for runs not recorded with the reference workload. Code is imported only from what you name here",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a replay already in --out")
    p.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="ranks to replay on: the golden run's world size, which is the default (a replay runs every "
        "rank of the golden run, each with its own shard, checkpoints and log)",
    )
    p.add_argument(
        "--rank-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="multi-rank runs: seconds a rank may wait in one collective before the replay fails",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    golden = golden_header(args.golden, args.nproc)
    if args.suspect is not None:
        suspect = suspect_from_run(args.suspect, golden, args.golden)
    else:
        suspect = suspect_from_profile(args.fault_profile, args.fault_seed)
    if args.at_first_divergence:
        if args.suspect is None or args.steps is not None:
            raise UsageError("--at-first-divergence needs --suspect RUN and no --steps")
        for side, run in (("golden", args.golden), ("suspect", args.suspect)):
            if unstarted := ranks_without_steps(run):
                print(
                    f"no steps to compare: the {side} {run} completed no step on rank(s) "
                    f"{', '.join(map(str, unstarted))} (it failed or crashed in its first): nothing to replay"
                )
                return 0
        first = compare_runs(args.golden, args.suspect).first
        if first is None:
            print(f"{args.golden} and {args.suspect} never diverge: nothing to replay")
            return 0
        steps = range(max(0, first.step - args.window), first.step + args.window + 1)
        print(f"first divergence: {first.describe()}; replaying steps {steps.start}:{steps.stop}")
    elif args.steps is None:
        raise UsageError("give --steps A:B or --at-first-divergence")
    else:
        steps = parse_steps(args.steps)
    request = ReplayRequest(
        golden=args.golden,
        out=args.out,
        steps=steps,
        suspect=suspect,
        mode=args.mode,
        golden_from=args.golden_from,
        workload=args.workload,
        overwrite=args.overwrite,
        progress=not args.quiet,
        clip=args.at_first_divergence,
    )
    summaries = replay(request, golden, rank_timeout_s=args.rank_timeout)
    n = len(summaries)
    checked = sum(s.checked for s in summaries)
    print(
        f"replayed {len(summaries[0].steps)} step(s) in {args.mode} mode on {suspect.label}, {n} rank(s) "
        f"({checked:,} golden fingerprints verified, {summaries[0].wall_s:.1f} s) -> {args.out}"
    )
    for rank, summary in enumerate(summaries):
        for r in summary.steps:
            detail = (
                f"worst site mismatch frequency {r.worst_frequency:.3g}"
                if args.mode == "lockstep"
                else f"noise-to-signal {r.noise:.3g}"
            )
            where = f"rank {rank} " if n > 1 else ""
            print(
                f"  {where}step {r.step:>5}: {detail}; loss golden {r.golden_loss:.6f} "
                f"suspect {r.suspect_loss:.6f}; {r.faults} injected fault(s)"
            )
    print(f"next: sdc inspect {args.out}")
    return 0
