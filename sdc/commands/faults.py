"""``sdc faults``: list and print the fault profiles that ship with sdctrace."""

from __future__ import annotations

import argparse

from faults import load_profile, shipped_profiles


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "faults",
        help="list or print the shipped fault profiles",
        description=(
            "Fault profiles describe emulated unhealthy nodes for `sdc record --fault-profile`. "
            "Copy a shipped one (`sdc faults show NAME > my.toml`), edit it, and pass its path."
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="one line per shipped profile").set_defaults(handler=run_list)
    show = actions.add_parser("show", help="print a profile's file, comments included")
    show.add_argument("profile", metavar="NAME", help="a shipped profile name or a path to a profile")
    show.set_defaults(handler=run_show)


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
