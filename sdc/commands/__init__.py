"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import demo, diff, faults, inspect, record, replay, study, verify

ALL = [record, inspect, verify, replay, faults, diff, study, demo]
