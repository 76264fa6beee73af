"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import demo, diff, faults, finetune, inspect, query, record, replay, report, study, verify

ALL = [record, inspect, verify, replay, faults, diff, finetune, query, report, study, demo]
