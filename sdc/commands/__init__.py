"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import diff, faults, inspect, record, replay, verify

ALL = [record, inspect, verify, replay, faults, diff]
