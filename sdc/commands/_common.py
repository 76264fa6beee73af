"""Options shared by several sub-commands."""

from __future__ import annotations

import argparse

from tracer.workload.config import Config, load_config, shipped_configs


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


def add_device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="cpu",
        metavar="DEV",
        help="where to train: cpu (default), cuda[:N], or xla[:N] (needs torch_xla and its own torch: docs/xla.md)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"run.steps={args.steps}")
    return load_config(args.config, overrides)
