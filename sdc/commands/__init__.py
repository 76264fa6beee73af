"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import demo, diff, faults, finetune, inspect, query, record, replay, report, study, verify, watch

ALL = [record, inspect, verify, replay, faults, diff, watch, finetune, query, report, study, demo]
