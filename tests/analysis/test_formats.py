"""`sdc query --sql` prints every DuckDB type, nested in LIST, STRUCT and MAP too, in every format, with the
documented JSON mapping (issue 31, case 8); control characters in values and names are escaped in the table and
CSV ("output safe to print")."""

from __future__ import annotations

import csv
import datetime
import io
import json
from pathlib import Path

import pytest

from analysis.load import load_parquet
from sdc.cli import main
from tests.analysis.test_load import stage

UUID = "12345678-1234-5678-1234-567812345678"
TYPES = {  # name: (a DuckDB literal, its JSON form)
    "timestamp": ("TIMESTAMP '2024-01-02 03:04:05.123456'", "2024-01-02T03:04:05.123456"),
    "timestamp_s": ("TIMESTAMP_S '2024-01-02 03:04:05'", "2024-01-02T03:04:05"),
    "timestamp_ns": ("TIMESTAMP_NS '2024-01-02 03:04:05.123456789'", "2024-01-02T03:04:05.123456"),
    "date": ("DATE '2024-01-02'", "2024-01-02"),
    "time": ("TIME '03:04:05.5'", "03:04:05.500000"),
    "timetz": ("TIMETZ '03:04:05+02'", "03:04:05+02:00"),
    "interval": ("INTERVAL '1 month 2 days 3 hours 4.5 seconds'", "P32DT3H4.5S"),
    "negative interval": ("INTERVAL '-1 day 2 seconds'", "-PT23H59M58S"),
    "zero interval": ("INTERVAL '0 seconds'", "PT0S"),
    "uuid": (f"UUID '{UUID}'", UUID),
    "blob": (r"'\x00\xFF\x1B'::BLOB", "AP8b"),
    "decimal": ("1.25::DECIMAL(10, 2)", 1.25),
    "hugeint": ("170141183460469231731687303715884105727::HUGEINT", 2**127 - 1),
    "uhugeint": ("340282366920938463463374607431768211455::UHUGEINT", 2**128 - 1),
    "ubigint": ("18446744073709551615::UBIGINT", 2**64 - 1),
    "double": ("0.1::DOUBLE", 0.1),
    "nan": ("'nan'::DOUBLE", "NaN"),
    "infinity": ("'inf'::FLOAT", "Infinity"),
    "-infinity": ("'-inf'::DOUBLE", "-Infinity"),
    "boolean": ("true", True),
    "null": ("NULL::INTEGER", None),
    "varchar": ("'naïve'", "naïve"),
    "enum": ("'b'::ENUM('a', 'b')", "b"),
    "bit": ("'101'::BIT", "101"),
    "array": ("[1, 2]::INTEGER[2]", [1, 2]),
}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("formats")
    load_parquet(root / "study.duckdb", stage(root / "staging", [1.0]), "pair-a")
    return root / "study.duckdb"


def query(capsys: pytest.CaptureFixture[str], db: Path, sql: str, fmt: str) -> str:
    assert main(["query", "--sql", sql, "--db", str(db), "--format", fmt]) == 0
    captured = capsys.readouterr()
    assert not captured.err, captured.err
    return captured.out


def nested_sql(literal: str) -> str:
    """The value, in a LIST, a STRUCT and a MAP, and as a MAP key (not NULL or NaN; a list key: see below)."""
    keys = "" if "NULL" in literal or "nan" in literal or literal.startswith("[") else f", MAP {{{literal}: 1}} AS k"
    return f"SELECT {literal} AS v, [{literal}] AS l, {{'f': {literal}}} AS s, MAP {{'m': {literal}}} AS m{keys}"


def csv_field(expected: object) -> str:
    """What CSV shows at the top level for a value of this JSON form: floats in Python's repr (nan, inf)."""
    special = {None: "", True: "true", False: "false", "NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}
    if isinstance(expected, bool | str | None):
        return special.get(expected, expected)  # type: ignore[arg-type, return-value]  # a plain str is itself
    return repr(expected) if isinstance(expected, float) else str(expected)


@pytest.mark.parametrize("name", TYPES)
def test_every_type_nested_or_not_in_every_format(db: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    literal, expected = TYPES[name]
    sql = nested_sql(literal)
    nested = {"l": [expected], "s": {"f": expected}, "m": {"m": expected}}
    key = expected if isinstance(expected, str) else json.dumps(expected)
    keyed = {"k": {key: 1}} if ", MAP {" + literal in sql else {}

    [row] = json.loads(query(capsys, db, sql, "json"))
    assert row == {"v": expected, **nested, **keyed}

    header, values = list(csv.reader(io.StringIO(query(capsys, db, sql, "csv"))))
    fields = dict(zip(header, values, strict=True))
    for column, value in {**nested, **keyed}.items():
        assert json.loads(fields[column]) == value, column
    assert fields["v"] == csv_field(expected)

    table = query(capsys, db, sql, "table")
    for value in nested.values():
        assert json.dumps(value, ensure_ascii=False) in table


def test_time_zone_types_keep_their_instant(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = nested_sql("TIMESTAMPTZ '2024-01-02 03:04:05+02'")
    [row] = json.loads(query(capsys, db, sql, "json"))
    instant = datetime.datetime(2024, 1, 2, 1, 4, 5, tzinfo=datetime.UTC)
    assert datetime.datetime.fromisoformat(row["v"]) == instant
    assert datetime.datetime.fromisoformat(row["s"]["f"]) == instant


def test_deep_nesting_and_map_shapes(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = (
        "SELECT {'k': MAP {'a': [TIMESTAMP '2024-01-01', NULL]}, 'b': [[UUID '" + UUID + "']]} AS deep, "
        "MAP {[1, 2]: 'x'} AS list_keys, MAP {DATE '2024-01-02': [INTERVAL '1 hour']} AS date_keys"
    )
    [row] = json.loads(query(capsys, db, sql, "json"))
    assert row == {
        "deep": {"k": {"a": ["2024-01-01T00:00:00", None]}, "b": [[UUID]]},
        "list_keys": {"key": [[1, 2]], "value": ["x"]},
        "date_keys": {"2024-01-02": ["PT1H"]},
    }


ESCAPES = "\x1b[31mred\x1b[0m \r\x00\x07 \u202egnp.exe\x9b"
SHOWN = "\\x1b[31mred\\x1b[0m \\r\\x00\\x07 \\u202egnp.exe\\x9b"


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_control_characters_are_escaped_in_table_and_csv(
    db: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    literal = "'" + ESCAPES.replace("'", "''") + "'"
    sql = f'SELECT {literal} AS v, [{literal}] AS l, 1 AS "col\x1b[2J"'
    out = query(capsys, db, sql, fmt)
    assert not any(ch in out for ch in "\x1b\r\x00\x07\u202e\x9b"), repr(out)
    assert SHOWN in out and "col\\x1b[2J" in out


def test_json_escapes_control_characters_and_keeps_the_value(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    literal = "'" + ESCAPES + "'"
    out = query(capsys, db, f"SELECT {literal} AS v, [{literal}] AS l", "json")
    assert not any(ch in out for ch in "\x1b\r\x00\x07\u202e\x9b")
    assert json.loads(out) == [{"v": ESCAPES, "l": [ESCAPES]}]
