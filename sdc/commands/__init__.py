"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import demo, diff, faults, inspect, query, record, replay, report, study, verify

ALL = [record, inspect, verify, replay, faults, diff, query, report, study, demo]
