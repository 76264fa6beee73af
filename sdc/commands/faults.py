"""``sdc faults``: list and print the fault profiles that ship with sdctrace, and draw a fleet of them."""

from __future__ import annotations

import argparse
from pathlib import Path

from faults import load_profile, shipped_profiles
from faults.fleet import MAX_NODES, MODELS, FleetSpec
from faults.fleet_files import drawn, write_fleet
from sdc.commands import Command
from sdc.commands._common import seed
from tracer.errors import UsageError


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Fault profiles describe emulated unhealthy nodes for `sdc record --fault-profile`. "
            "Copy a shipped one (`sdc faults show NAME > my.toml`), edit it, and pass its path; "
            "or draw a whole fleet of them (`sdc faults fleet`)."
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="one line per shipped profile").set_defaults(handler=run_list)
    show = actions.add_parser("show", help="print a profile's file, comments included")
    show.add_argument("profile", metavar="NAME", help="a shipped profile name or a path to a profile")
    show.set_defaults(handler=run_show)
    fl = actions.add_parser(
        "fleet",
        help="write the profiles of a seeded fleet of emulated unhealthy nodes",
        description=(
            "Draw N emulated unhealthy nodes from the fleet model (docs/fleet.md): per-node rates spanning "
            "orders of magnitude, bursts, mostly small corruptions with a tail of 100-1000x ones, inside and "
            "outside matrix multiplication, and one node whose fine-tuning a spike destroys. Writes "
            "node-01.toml ... (ordinary profiles: read, edit, pass to --fault-profile) and fleet.md, a table of "
            "what each node drew. The same --model, --nodes and --seed give the same files, byte for byte. "
            "--model hardware draws from the hardware-grounded model instead (docs/fleet.md): steady stuck-at "
            "defects in one unit each, with outcome shares taken from published GPU measurements."
        ),
    )
    fl.add_argument(
        "--model",
        choices=MODELS,
        default=FleetSpec.model,
        help="the fleet model: study (calibrated around the reference study, the default) or hardware "
        "(parameters from published GPU SDC measurements; docs/fleet.md cites each)",
    )
    fl.add_argument(
        "--nodes",
        type=int,
        default=FleetSpec.nodes,
        metavar="N",
        help=f"nodes in the fleet, 1..{MAX_NODES} (default: {FleetSpec.nodes})",
    )
    fl.add_argument(
        "--seed",
        type=seed,
        default=FleetSpec.seed,
        metavar="S",
        help=f"the seed of every draw (default: {FleetSpec.seed}, the study model's calibrated fleet)",
    )
    fl.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write the fleet into")
    fl.add_argument("--overwrite", action="store_true", help="write into --out even if it is not empty")
    fl.set_defaults(handler=run_fleet)


def run_list(args: argparse.Namespace) -> int:
    names = shipped_profiles()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {load_profile(name).description}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)  # validates, so what is shown also loads
    with open(profile.path, encoding="utf-8") as f:
        print(f.read(), end="")
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    spec = FleetSpec(nodes=args.nodes, seed=args.seed, model=args.model)
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory for the fleet's profiles")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UsageError(f"--out {out} is not empty; pass --overwrite to write the fleet into it anyway")
    paths = write_fleet(spec, out)
    for node, path in zip(drawn(spec), paths):
        print(f"{path}  {node.line}")
    return 0
