"""One crafted input run through its command, and its outcome: the classifier of tools/fuzz_inputs.py.

    outcome, last_line = run_case(Case("tolerance", "map text", ("diff", ..., "--tolerance", path), crafted=path))

A case runs in this process through ``sdc.cli.main`` under a watchdog, and ends as one of:

- ``one-line error``: exit 1 or 2 with one ``sdc: error`` line naming the crafted file (what must happen);
- ``multi-line error``: refused, in more than one line;
- ``silently accepted``: exit 0, a verdict, or an error about something other than the crafted file;
- ``traceback``: an exception escaped ``main``;  ``hang``: the watchdog fired;
- ``data changed``: a refused command changed the file it watches, or a command changed a ``foreign`` one (a
  database sdctrace did not create, or a ``.wal`` appeared beside it) whatever its exit;
- ``code ran``: a shared library was loaded (``torch.ops.loaded_libraries`` grew) or a marker file appeared;
- ``ok``: exit 0 where that is right: a case marked ``may_succeed`` (a crafted file that is still sdctrace's own).
"""

from __future__ import annotations

import hashlib
import io
import signal
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sdc.cli import main as sdc_main

OUTCOMES = (
    "ok",
    "one-line error",
    "multi-line error",
    "traceback",
    "hang",
    "silently accepted",
    "data changed",
    "code ran",
)
BAD = ("traceback", "hang", "silently accepted", "data changed", "code ran")
TIMEOUT_S = 30
VERDICT_EXITS = (0, 4, 5, 6)


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    argv: tuple[str, ...]
    crafted: str  # the refusal must name this path
    watch: str | None = None  # a file a refusal must leave unchanged
    marker: str | None = None  # a file that exists only if crafted code ran
    foreign: bool = False  # ``watch`` is not sdctrace's: no exit may change it
    may_succeed: bool = False  # exit 0 is right (the crafted file is still a valid one)


class _Hang(BaseException):
    pass


def _digest(path: str | None) -> str | None:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and Path(path).is_file() else None


def _changed(case: Case, before: str | None, code: int) -> bool:
    if case.watch is None:
        return False
    if case.foreign and Path(case.watch + ".wal").exists():
        return True
    return (code != 0 or case.foreign) and before is not None and _digest(case.watch) != before


def run_case(case: Case) -> tuple[str, str]:
    """(outcome, the last line it printed) of one case."""
    before, libraries = _digest(case.watch), set(torch.ops.loaded_libraries)
    out, err = io.StringIO(), io.StringIO()

    def hung(*_: Any) -> None:
        raise _Hang

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(TIMEOUT_S)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = sdc_main(list(case.argv))
    except _Hang:
        return "hang", ""
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001  # what the campaign counts
        return "traceback", f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    lines = [line for line in err.getvalue().splitlines() if not line.startswith("sdc: warning")]
    last = lines[-1] if lines else out.getvalue().strip()[-160:]
    if set(torch.ops.loaded_libraries) != libraries or (case.marker and Path(case.marker).exists()):
        return "code ran", last
    if _changed(case, before, code):
        return "data changed", last
    if case.may_succeed and code == 0:
        return "ok", last
    if code in VERDICT_EXITS and not (code != 0 and lines):
        return "silently accepted", last
    if len(lines) == 1 and lines[0].startswith("sdc: error") and case.crafted in lines[0]:
        return "one-line error", last
    if len(lines) == 1 and lines[0].startswith("sdc: error"):
        return "silently accepted", last  # refused, but for something other than the crafted file
    return "multi-line error", last
