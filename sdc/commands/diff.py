"""``sdc diff``: diff a golden and a suspect run (and replay logs) into a DuckDB study database."""

from __future__ import annotations

import argparse

from pipelines.arguments import DiffRequest, add_arguments
from pipelines.diff_job import diff_job
from sdc.commands import Command


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Validate that two runs pair, then diff them with an Apache Beam job: every fingerprint, the first "
            "divergence per rank, losses and loss spikes, parameter drift at common checkpoints, fault ground truth "
            "against fingerprint and ABFT detections, and the RQ1/RQ2 metrics of replay logs. The tables are "
            "loaded into --db, replacing this pair's earlier rows (analysis/SCHEMA.md describes them)."
        ),
        epilog=(
            "Beam options go after `--`, e.g. `-- --direct_running_mode=multi_processing --direct_num_workers=4` or "
            "`-- --runner=apache_beam.runners.dask.dask_runner.DaskRunner --dask_client_address=HOST:8786`. "
            "Default: Beam's FnApiRunner, in this process below 1 GiB of logs (docs/pipelines.md)."
        ),
    )
    add_arguments(p)
    p.add_argument("beam_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    diff_job()(request(args))
    return 0


def request(args: argparse.Namespace) -> DiffRequest:
    """The typed request of a parsed command line; Beam's options are what follows `--`."""
    beam_args = args.beam_args[1:] if args.beam_args[:1] == ["--"] else args.beam_args
    return DiffRequest.from_args(args, beam_args)
