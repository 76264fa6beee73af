"""Targets of the launcher's preload test (`tests/parallel/test_launch.py`): which process imported a preloaded
workload module, and whether a thread that module started as it imported runs in the rank."""

from __future__ import annotations

import os

IMPORTED_BY = os.getpid()


def imported_by() -> list[int]:
    """The pid that imported this module, and this rank's own."""
    return [IMPORTED_BY, os.getpid()]


def thread_alive() -> list[object]:
    """The pid that imported tests.parallel.thread_at_import, this rank's own, and whether its thread runs here."""
    from tests.parallel import thread_at_import

    return [thread_at_import.IMPORTED_BY, os.getpid(), thread_at_import.started.is_alive()]
