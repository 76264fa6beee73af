"""``sdc``: the command line of sdctrace, one sub-command per job.

Anything a user can cause ends in a one-line ``sdc: error: ...`` and exit status 1
(2 for bad usage; an error's own ``exit_code`` where it has one: 3 when the guard
stopped training), never a traceback. ``SDC_DEBUG=1`` shows tracebacks.

`main` builds the whole parser of the command being run only, and the others' names and one-line help (all that
``sdc --help`` shows of them), so no command pays for importing what another one runs (torch, Beam).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Collection, Sequence

from sdc.commands import COMMANDS
from tracer.errors import sdc_error_of
from tracer.printable import printable_lines

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def build_parser(whole: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of `sdc`: the whole parser of the commands named in `whole` (default: of every command) and
    the name and one-line help of the others. Its help and the help of each command it builds whole are the
    same either way."""
    parser = argparse.ArgumentParser(
        prog="sdc",
        description=(
            "Find and characterise silent data corruption in LLM training: record "
            "fingerprinted training runs, inspect them and check that they are deterministic."
        ),
        epilog="Run `sdc COMMAND --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        if whole is None or command.name in whole:
            command.add_parser(sub)
        else:
            command.add_stub(sub)
    return parser


def command_named(argv: Sequence[str]) -> tuple[str, ...]:
    """The command an `sdc` command line runs (its first word that is not an option), or none."""
    return next(((a,) for a in argv if not a.startswith("-")), ())


def _one_line_warnings(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    print(f"sdc: warning: {printable_lines(str(message))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(whole=command_named(argv)).parse_args(argv)
    debug = os.environ.get("SDC_DEBUG") == "1"
    if not debug:
        warnings.showwarning = _one_line_warnings
    try:
        return int(args.handler(args) or 0)
    except Exception as exc:
        error = sdc_error_of(exc)
        if debug or error is None:
            raise
        print(f"sdc: error: {printable_lines(str(error))}", file=sys.stderr)
        return getattr(error, "exit_code", EXIT_ERROR)
    except KeyboardInterrupt:
        print("sdc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
