"""The diff job, imported only when one runs, so that building the ``sdc`` parser does not import Beam.

    from pipelines.diff_job import diff_job
    report = diff_job()(DiffRequest(golden="runs/A", suspect="runs/B", db=Path("study.duckdb")))

Apart from `pipelines.arguments` (which `pipelines.run` imports) so the lazy import makes no import circle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.arguments import DiffRequest
    from pipelines.run import DiffReport


def diff_job() -> Callable[[DiffRequest], DiffReport]:
    """`pipelines.run.diff`, imported without the warnings importing Beam prints about Google Cloud clients."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        from pipelines.run import diff
    finally:
        root.setLevel(level)
    return diff
