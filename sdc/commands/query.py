"""``sdc query``: run a named query (or one SELECT) on a study database, read-only."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sdc.commands import Command
from tracer.errors import UsageError


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Print the result of a named query over the DuckDB database `sdc diff` wrote: `summary` first, then "
            "the rq1_ (submodule mismatches, detection), rq2_ (gradient noise) and rq3_ (drift, loss, first "
            "divergence) breakdowns. --sql runs one SELECT of your own. The database is opened read-only; "
            "statements that would write (DELETE, CREATE, ATTACH, COPY ... TO, INSTALL, ...) are refused."
        ),
        epilog="Examples: sdc query --list; sdc query summary --db study.duckdb; "
        "sdc query --sql 'SELECT * FROM loss_spikes' --db study.duckdb --format csv",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="a named query (see --list)")
    p.add_argument("--sql", metavar="SELECT", help="run this one SELECT statement instead of a named query")
    p.add_argument("--list", action="store_true", help="list the named queries with what each answers")
    p.add_argument("--db", type=Path, metavar="FILE", help="the study database written by `sdc diff`")
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="table: aligned, floats to 4 significant digits (default); csv, json: every digit, for programs. Table "
        "and csv escape control characters (ANSI escapes, \\r, ...); every DuckDB type has one JSON form "
        "(ISO 8601 times and durations, base64 BLOBs, UUIDs as strings: analysis/formats.py)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from analysis import formats, queries

    if args.list:
        if args.name or args.sql:
            raise UsageError("--list takes no NAME or --sql")
        names = queries.names()
        width = max(map(len, names), default=0)
        for name in names:
            print(f"{name:<{width}}  {queries.description(name)}")
        return 0
    if bool(args.name) == bool(args.sql):
        raise UsageError("give a query NAME or --sql 'SELECT ...' (one of the two); `sdc query --list` shows names")
    if args.db is None:
        raise UsageError("--db FILE is required: the study database written by `sdc diff`")
    result = queries.run(args.db, args.sql if args.sql else queries.sql(args.name))
    sys.stdout.write(formats.render(result, args.format))
    return 0
