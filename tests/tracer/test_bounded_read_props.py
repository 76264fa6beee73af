"""tracer/bounded_read.py's `parse_json`, property-based: whatever bytes arrive (JSON of any shape, depth, numbers
and strings, lone surrogates, text that is not JSON, bytes that are not UTF-8), the result is a value within every
bound, or one line ``<source>: <problem>; <fix>`` raised as the caller's error; never another exception."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tracer.bounded_read import Bounds, parse_json  # noqa: E402
from tracer.errors import ValidationError  # noqa: E402

BOUNDS = Bounds(depth=6, text=40, int_digits=20)
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=60)  # lone surrogates too
LEAVES = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | TEXT
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4))
RAW = st.one_of(
    VALUES.map(lambda v: json.dumps(v).encode()),
    st.integers(0, 40).map(lambda n: ("[" * n + "]" * n).encode()),
    st.text(max_size=80).map(str.encode),
    st.binary(max_size=80),
    st.tuples(VALUES, VALUES).map(lambda kv: f'{{"a": {json.dumps(kv[0])}, "a": {json.dumps(kv[1])}}}'.encode()),
)


def _within(value: Any, depth: int = 0) -> bool:
    if isinstance(value, (list, dict)):
        items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
        return depth < BOUNDS.depth and all((k is None or _within(k)) and _within(v, depth + 1) for k, v in items)
    if isinstance(value, str):
        return len(value) <= BOUNDS.text and _utf8(value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 10**BOUNDS.int_digits
    return value is None or isinstance(value, bool)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@settings(max_examples=300, deadline=None, database=None)
@given(RAW)
@example(b'{"\\n": 100000000000000000000}')  # a key's line break once reached the message (found 2026-12-04)
def test_any_bytes_give_a_bounded_value_or_one_line(data: bytes) -> None:
    try:
        value = parse_json(data, "from-elsewhere.json", BOUNDS, "send it again", ValidationError)
    except ValidationError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("from-elsewhere.json: "), message
        assert message.endswith("; send it again"), message
    else:
        assert _within(value), value
