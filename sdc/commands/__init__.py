"""Sub-commands of ``sdc``; each module has ``add_parser(subparsers)``."""

from sdc.commands import diff, faults, finetune, inspect, record, replay, verify

ALL = [record, inspect, verify, replay, faults, diff, finetune]
