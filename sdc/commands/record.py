"""``sdc record``: train a workload (the reference one by default) under a Tracer into a run directory."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import get_args

from faults import load_profile, shipped_profiles
from jobs.record import RecordRequest, record
from sdc.commands import Command
from sdc.commands._common import (
    add_config_options,
    add_device_option,
    add_parallel_options,
    add_workload_option,
    config_from_args,
    seed,
)
from tracer.errors import ConfigError
from tracer.guard import Policy
from tracer.options import CapturePolicy, TraceOptions
from workload.protocol import REFERENCE


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Train a workload deterministically (the reference LLaMA-style one, or yours with --workload) "
            "and record, every step, "
            "fingerprints of each attention/feed-forward output and input gradient, every parameter "
            "gradient and every parameter, plus losses, learning rates and checkpoints."
        ),
    )
    add_workload_option(p)
    add_config_options(p)
    add_device_option(p)
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="run directory to create, e.g. runs/golden")
    p.add_argument(
        "--node-label", default=socket.gethostname(), metavar="L", help="name of the node (default: this host's name)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a run that already exists in --out")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the recording in --out that crashed or was killed: train on from its newest checkpoint that "
        "its log reaches, appending to the log (steps since that checkpoint are recorded again and supersede the "
        "first recording). Give the options the recording was started with",
    )
    p.add_argument(
        "--resume-from",
        type=Path,
        metavar="CHECKPOINT",
        help="start --out as a new run that goes on from another run's checkpoint RUN/checkpoints/step-NNNNNN, "
        "typically the one `sdc certify RUN --golden G` prints: --out gets RUN's records of the steps before it "
        "and its checkpoints up to it, and training goes on from it on this node (--node-label), with "
        "--fault-profile's faults or none. Give the training options RUN was recorded with",
    )
    p.add_argument("--checkpoint-every", type=int, metavar="N", help="steps between checkpoints (run.checkpoint_every)")
    p.add_argument(
        "--sites", metavar="REGEX", help="trace the modules whose full path matches REGEX instead of the defaults"
    )
    p.add_argument("--capture-steps", metavar="LIST", default="", help="keep full tensors of these steps, e.g. 0,5,10")
    p.add_argument("--capture-every", type=int, default=0, metavar="N", help="keep full tensors of every N-th step")
    p.add_argument("--capture-names", metavar="REGEX", help="only keep full tensors whose site/parameter name matches")
    p.add_argument(
        "--segment-mb", type=int, default=64, metavar="MB", help="roll log segments at this size (default 64)"
    )
    p.add_argument(
        "--fault-profile",
        metavar="PROFILE",
        help=f"emulate an unhealthy node: a shipped fault profile ({', '.join(shipped_profiles())}) "
        "or a path to a TOML file; see `sdc faults list`",
    )
    p.add_argument(
        "--fault-seed", type=seed, default=0, metavar="S", help="seed of the emulated faults, with the profile's own"
    )
    p.add_argument("--abft", action="store_true", help="check every matmul's checksums and log an abft event for each")
    p.add_argument(
        "--guard",
        choices=get_args(Policy),
        metavar="POLICY",
        help="check every step before the optimizer (NaN/Inf, loss and gradient-norm spikes, ABFT flags with "
        "--abft), re-run a flagged step and, if it reproduces, continue, skip the step or stop with a "
        "checkpoint (exit status 3); docs/guard.md",
    )
    add_parallel_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.checkpoint_every is not None:
        args.overrides.append(f"run.checkpoint_every={args.checkpoint_every}")
    request = RecordRequest(
        out=args.out,
        node_label=args.node_label,
        workload=args.workload or REFERENCE,
        overwrite=args.overwrite,
        trace=TraceOptions(
            sites=args.sites,
            segment_bytes=args.segment_mb << 20,
            capture=CapturePolicy(
                steps=frozenset(_int_list(args.capture_steps)), every=args.capture_every, names=args.capture_names
            ),
        ),
        progress=not args.quiet,
        fault_profile=load_profile(args.fault_profile) if args.fault_profile is not None else None,
        fault_seed=args.fault_seed,
        abft=args.abft,
        device=args.device,
        guard=args.guard,
        resume=args.resume,
        resume_from=args.resume_from,
    )
    config, n = config_from_args(args)
    summary = record(config, request, nproc=n, rank_timeout=args.rank_timeout)
    steps = summary.steps
    resumed = "" if summary.resumed_from is None else f" (resumed at step {summary.resumed_from})"
    print(
        f"recorded {steps} step{'' if steps == 1 else 's'}{resumed} on {n} rank{'' if n == 1 else 's'} "
        f"to {args.out} (final loss {summary.final_loss:.4f}, {summary.wall_s:.1f} s)\n"
        f"next: sdc inspect {args.out}"
    )
    return 0


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--capture-steps {text!r}: expected comma-separated step numbers such as 0,5,10") from None
