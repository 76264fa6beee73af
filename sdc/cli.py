"""``sdc``: the command line of sdctrace, one sub-command per job.

Anything a user can cause ends in a one-line ``sdc: error: ...`` and exit status 1
(2 for bad usage; an error's own ``exit_code`` where it has one: 3 when the guard
stopped training), never a traceback. ``SDC_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

from sdc import commands
from tracer.errors import SdcError
from tracer.printable import printable

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdc",
        description=(
            "Find and characterise silent data corruption in LLM training: record "
            "fingerprinted training runs, inspect them and check that they are deterministic."
        ),
        epilog="Run `sdc COMMAND --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in commands.ALL:
        module.add_parser(sub)
    return parser


def _one_line_warnings(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    print(f"sdc: warning: {printable(str(message))}", file=sys.stderr)


def _sdc_error(exc: BaseException) -> SdcError | None:
    """The SdcError behind ``exc``: itself, or one that torch.compile's Dynamo re-raised as its own error (an
    sdctrace check that runs while Dynamo compiles, `tracer.compiled`)."""
    if isinstance(exc, SdcError):
        return exc
    if type(exc).__module__.startswith("torch._dynamo") and isinstance(exc.__context__, SdcError):
        return exc.__context__
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = os.environ.get("SDC_DEBUG") == "1"
    if not debug:
        warnings.showwarning = _one_line_warnings
    try:
        return int(args.handler(args) or 0)
    except Exception as exc:
        error = _sdc_error(exc)
        if debug or error is None:
            raise
        print(f"sdc: error: {printable(str(error))}", file=sys.stderr)
        return getattr(error, "exit_code", EXIT_ERROR)
    except KeyboardInterrupt:
        print("sdc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
