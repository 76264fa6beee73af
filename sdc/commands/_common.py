"""Options shared by several sub-commands."""

from __future__ import annotations

import argparse
from typing import Any

from tracer.errors import ConfigError
from workload.protocol import load_workload_config
from workload.reference_config import MAX_SEED, load_config, shipped_configs


def seed(text: str) -> int:
    """An argparse type: a seed torch and numpy both take (0..2^63-1), so a huge one is refused on the command
    line, not after a run has been recorded."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text} is not in 0..{MAX_SEED}")
    return value


def add_config_options(p: argparse.ArgumentParser) -> None:
    names = ", ".join(shipped_configs())
    p.add_argument(
        "--config",
        metavar="CFG",
        help=f"a shipped config name ({names}) or a path to a TOML file; default: tiny",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config value, e.g. --set model.n_layers=2 (repeatable)",
    )
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps to run (overrides run.steps)")


def add_workload_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        metavar="MODULE:FACTORY",
        help="your own training as package.module:factory (workload.protocol; docs/own-training.md); "
        "--config is then a TOML file handed to the factory as a dict. Default: the reference workload",
    )


def add_device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="cpu",
        metavar="DEV",
        help="where to train: cpu (default), cuda[:N], or xla[:N] (needs torch_xla and its own torch: docs/xla.md)",
    )


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ranks (tensor-, sequence- and data-parallel, on this machine)")
    g.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="ranks to launch, one process each on gloo; N = dp * tp (default: the config's layout, 1)",
    )
    g.add_argument("--tp", type=int, metavar="T", help="tensor-parallel ranks per replica (parallel.tp; default 1)")
    g.add_argument("--sp", action="store_true", help="sequence parallelism inside each tensor-parallel group")
    g.add_argument("--dp", type=int, metavar="D", help="data-parallel replicas (parallel.dp; default N / T)")
    g.add_argument(
        "--rank-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds a rank may wait in one collective before the job fails (default 300)",
    )


def config_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """The config a job builds the workload from, with --set and --steps applied, and how many ranks run it.

    For the reference workload: the validated `Config` (--config, default tiny) with the rank layout of --nproc,
    --tp, --dp and --sp; for a user workload (--workload): its --config TOML file (or empty) as a dict, on
    --nproc ranks (default 1)."""
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"run.steps={args.steps}")
    if args.workload is not None:
        return load_workload_config(args.config, overrides), args.nproc or 1
    if any(getattr(args, k, None) not in (None, False) for k in ("nproc", "tp", "dp", "sp")):
        overrides += _layout_overrides(args)
    cfg = load_config(args.config, overrides)
    return cfg.to_dict(), cfg.parallel.dp * cfg.parallel.tp


def _layout_overrides(args: argparse.Namespace) -> list[str]:
    tp = args.tp if args.tp is not None else 1
    n = args.nproc if args.nproc is not None else tp * (args.dp or 1)
    if n < 1 or tp < 1:
        raise ConfigError(f"--nproc {n} --tp {tp}: both must be >= 1")
    if n % tp:
        raise ConfigError(f"--nproc {n} is not a multiple of --tp {tp}; launch dp * tp ranks")
    dp = args.dp if args.dp is not None else n // tp
    if dp * tp != n:
        raise ConfigError(f"--nproc {n} must equal --dp {dp} x --tp {tp}; change one of them")
    if args.sp and tp == 1:
        raise ConfigError("--sp splits the sequence over tensor-parallel ranks; give --tp 2 or more with it")
    overrides = [f"parallel.dp={dp}", f"parallel.tp={tp}"]
    return [*overrides, "parallel.sp=true"] if args.sp else overrides
