"""The diff job's own options, shared by ``python -m pipelines.run`` and ``sdc diff``.

Kept apart from `pipelines.run` so that building the ``sdc`` parser does not import Beam.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_STEPS_PER_BUCKET = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--golden", required=True, metavar="RUN", help="the healthy run's directory (local path or URL)")
    p.add_argument("--suspect", required=True, metavar="RUN", help="the run to check against it")
    p.add_argument("--replay", action="append", default=[], metavar="RUN",
                   help="a replay log of this pair (lockstep: RQ1, parameter sync: RQ2); repeatable")
    p.add_argument("--twin", metavar="RUN",
                   help="the golden fine-tune's shuffle-seed twin (`sdc finetune --shuffle-seed`): its disagreement "
                        "with --golden is the baseline suspect disagreement is compared with")
    p.add_argument("--db", required=True, type=Path, metavar="FILE", help="DuckDB study database to load into")
    p.add_argument("--staging", metavar="DIR",
                   help="an empty directory (a URL on a cluster) for the job's Parquet; default: a temporary "
                        "directory beside --db, removed after loading")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="load what is readable and list corrupt records in the corruptions table, instead of failing")
    p.add_argument("--steps-per-bucket", type=int, default=DEFAULT_STEPS_PER_BUCKET, metavar="N",
                   help=f"steps per joined batch (default {DEFAULT_STEPS_PER_BUCKET}); lower it for very large models")
