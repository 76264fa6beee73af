"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import diff, faults, inspect, query, record, replay, report, verify

ALL = [record, inspect, verify, replay, faults, diff, query, report]
