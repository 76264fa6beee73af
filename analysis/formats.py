"""Query results as text: an aligned table for a terminal, CSV and JSON for programs.

    render(result, "table")     # or "csv", "json"
    json_value(value)           # any value DuckDB returns, nested or not, as JSON holds it

Every DuckDB type has one JSON form (`json_value`). The JSON output is made of it; a table cell or a
CSV field shows a nested value (LIST, ARRAY, STRUCT, MAP) as that JSON on one line, and a scalar that
is not a number or a boolean as the JSON form's text:

- NULL: null (the table shows ``-``, CSV an empty field);
- BOOLEAN: true, false;
- TINYINT ... BIGINT, HUGEINT, UHUGEINT (and unsigned): a number with every digit (a reader that parses
  numbers as doubles keeps about 16 of them);
- FLOAT, DOUBLE: a number, Python's shortest round trip; NaN and infinities have no JSON number, so
  they are the strings "NaN", "Infinity" and "-Infinity" (as protobuf's JSON mapping has them);
- DECIMAL: a number, as a double (CAST it to VARCHAR in the query to keep every digit);
- VARCHAR, ENUM, BIT, JSON, BIGNUM: a string (DuckDB's client gives these as text);
- DATE, TIME, TIMETZ, TIMESTAMP (_S, _MS, _NS), TIMESTAMPTZ: an ISO 8601 string (2024-01-02,
  03:04:05+02:00, 2024-01-02T03:04:05.123456, with the offset for the time-zone types);
- INTERVAL: an ISO 8601 duration (P32DT3H4.5S, -PT23H59M58S);
- UUID: a string, 8-4-4-4-12 lowercase hex;
- BLOB: a base64 string (RFC 4648, padded);
- LIST, ARRAY: an array; STRUCT: an object; MAP: an object whose keys are their JSON form as text
  (1 -> "1", a DATE -> "2024-01-02"); a MAP with LIST or STRUCT keys is ``{"key": [...], "value": [...]}``,
  as DuckDB's client gives it; UNION: its member's form.

DuckDB's Python client, before this module, gives a month of an INTERVAL as 30 days, nanosecond
timestamps to the microsecond, and ±infinity dates and timestamps as Python's largest and smallest
(9999-12-31T23:59:59.999999, 0001-01-01).

The table rounds floats to 4 significant digits; CSV keeps every digit. Table and CSV escape control
characters in every text they print, values and column names (`tracer.printable`: ANSI escapes,
``\\r``, ``\\x00``, bidirectional overrides), so printing a result never drives the terminal; JSON
escapes them by its own rules, and every non-ASCII character with them.
"""

from __future__ import annotations

import base64
import csv
import datetime
import io
import json
import math
from decimal import Decimal
from typing import Any

from analysis.queries import Result
from tracer.printable import printable

FORMATS = ("table", "csv", "json")
NULL = "-"


def json_value(value: Any) -> Any:
    """``value`` as JSON holds it (the mapping of the module's docstring): None, bool, int, float, str, list, dict."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {_key(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return _text(value)


def cell(value: Any) -> str:
    """One value as a person reads it."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | Decimal):
        return f"{float(value):.4g}"
    return _shown(value)


def table(result: Result) -> str:
    """Columns aligned (numbers right, text left) under a header and a rule."""
    rows = [[cell(v) for v in row] for row in result.rows]
    columns = [printable(c) for c in result.columns]
    numeric = [
        all(
            isinstance(row[i], int | float | Decimal) and not isinstance(row[i], bool)
            for row in result.rows
            if row[i] is not None
        )
        for i in range(len(columns))
    ]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(columns), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def csv_text(result: Result) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([printable(c) for c in result.columns])
    for row in result.rows:
        writer.writerow(["" if v is None else _csv_value(v) for v in row])
    return buf.getvalue()


def json_text(result: Result) -> str:
    """A JSON array of objects, one per row, one row per line."""
    lines = [json.dumps(json_value(r), allow_nan=False) for r in result.records()]
    return "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[]\n"


def render(result: Result, fmt: str) -> str:
    return {"table": table, "csv": csv_text, "json": json_text}[fmt](result)


def _csv_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Decimal):
        return str(value)
    return _shown(value)


def _shown(value: Any) -> str:
    """A value that is not null, a boolean or a float, as the table and CSV print it: safe for a terminal."""
    if isinstance(value, list | tuple | dict):
        return printable(json.dumps(json_value(value), ensure_ascii=False, allow_nan=False))
    return printable(value if isinstance(value, str) else str(json_value(value)))


def _key(key: Any) -> str:
    """A MAP key as a JSON object's key: its JSON form, as text."""
    value = json_value(key)
    return value if isinstance(value, str) else json.dumps(value, allow_nan=False)


def _text(value: Any) -> str:
    """A scalar JSON has no type for, as a string."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return _duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)  # UUID, and whatever a later DuckDB client returns


def _duration(delta: datetime.timedelta) -> str:
    """An ISO 8601 duration: P[nD][T[nH][nM][n.nS]], PT0S for none, a leading '-' when negative."""
    sign, delta = ("-", -delta) if delta < datetime.timedelta(0) else ("", delta)
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    second = f"{seconds}.{delta.microseconds:06d}".rstrip("0").rstrip(".") if delta.microseconds else str(seconds)
    time = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n)
    time += f"{second}S" if seconds or delta.microseconds else ""
    day = f"{delta.days}D" if delta.days else ""
    if not day and not time:
        return "PT0S"
    return f"{sign}P{day}{'T' + time if time else ''}"
