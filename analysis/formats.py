"""Query results as text: an aligned table for a terminal, CSV and JSON for programs.

The table rounds floats to 4 significant digits and shows null as ``-``; CSV and JSON
keep every digit (Python's shortest round-trip repr). JSON has no NaN or infinity, so
those become the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (as protobuf's
JSON mapping does); null is null.
"""

from __future__ import annotations

import csv
import io
import json
import math
from decimal import Decimal
from typing import Any

from analysis.queries import Result

FORMATS = ("table", "csv", "json")
NULL = "-"


def cell(value: Any) -> str:
    """One value as a person reads it."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | Decimal):
        return f"{float(value):.4g}"
    if isinstance(value, list | dict):
        return json.dumps(_plain(value))
    return str(value).replace("\n", "\\n")


def table(result: Result) -> str:
    """Columns aligned (numbers right, text left) under a header and a rule."""
    rows = [[cell(v) for v in row] for row in result.rows]
    numeric = [
        all(isinstance(row[i], int | float | Decimal) and not isinstance(row[i], bool)
            for row in result.rows if row[i] is not None)
        for i in range(len(result.columns))
    ]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(result.columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(result.columns), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def csv_text(result: Result) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow(["" if v is None else _csv_value(v) for v in row])
    return buf.getvalue()


def json_text(result: Result) -> str:
    """A JSON array of objects, one per row, one row per line."""
    lines = [json.dumps(_plain(r), allow_nan=False, default=str) for r in result.records()]
    return "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[]\n"


def render(result: Result, fmt: str) -> str:
    return {"table": table, "csv": csv_text, "json": json_text}[fmt](result)


def _csv_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(_plain(value))
    return repr(value) if isinstance(value, float) else str(value)


def _plain(value: Any) -> Any:
    """``value`` with every float JSON can hold, and the rest spelled out."""
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
