"""Property-based generators (Hypothesis) of the JSON fields tools/fuzz_inputs.py crafts, one field out of its rule.

    for what, line in draws(verdict_lines(), 50, seed=0): ...   # a verdict line no reader may take, and why
    for what, place in draws(map_places(), 50, seed=0): ...     # a tolerance-map place no reader may take

Each strategy draws a valid document's field and a value outside that field's rule (another JSON type, a number
past its range, a string too long, empty, or holding a lone surrogate, a word outside a closed set, the field
removed), so every draw is one that the reader must refuse: the campaign counts an exit 0 as silently accepted.
Hypothesis explores the edges (0, -0.0, the largest float, 2^62 + 1, the empty string) that a hand-written pool
misses. `draws` runs Hypothesis's generate phase only (no test fails, so nothing shrinks), seeded, no database.

Hypothesis is in the ``[test]`` extra; `available()` is False without it, and the campaign then uses its seeded
`random` pools for these fields as well.
"""

from __future__ import annotations

import math
from typing import Any

try:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st
except ImportError:  # the campaign falls back to its own pools
    st = None

VERDICT = {"machine": "h", "verdict": "transient", "emulated": None, "repeats": 1, "device": "cpu", "torch": "2"}
VERDICT_WORDS = ("transient", "persistent here", "nondeterministic", "unexplained")
PLACE = {
    "name": "mix",
    "phase": "forward",
    "events": 3,
    "max_ulps": 12,
    "ulp_events": 3,
    "max_rel_diff": 1e-7,
    "max_rel_error": 2e-7,
    "band": 4e-7,
}
PHASES = ("forward", "backward", "grad", "param", "input")
REMOVED = object()  # the field is left out


def available() -> bool:
    return st is not None


def draws(strategy: Any, n: int, seed: int) -> list[Any]:
    """Up to ``n`` values of ``strategy`` (fewer when Hypothesis finds no more distinct ones), the same for a seed."""
    found: list[Any] = []

    @seeded(seed)
    @settings(
        max_examples=n,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    return found[:n]


def _other_types(*keep: type) -> Any:
    """A JSON value of none of the types ``keep`` (bool is its own type here, as the readers treat it)."""
    pools = {
        bool: st.booleans(),
        int: st.integers(-(10**19), 10**19),
        float: st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
        str: st.text(max_size=8),
        type(None): st.none(),
        list: st.lists(st.integers(0, 9), max_size=3),
        dict: st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
    }
    return st.one_of(*(s for t, s in pools.items() if t not in keep))


def _bad_text(most: int, least: int = 0) -> Any:
    """A string outside ``least..most`` characters, or holding a lone surrogate, or no string at all."""
    surrogate = st.tuples(st.text(max_size=4), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))
    too_long = st.integers(most + 1, most + 64).map(lambda k: "x" * k)
    short = [st.just("")] if least > 0 else []
    return st.one_of(surrogate.map("".join), too_long, *short, _other_types(str))


def _outside(lo: float, hi: float, integral: bool) -> Any:
    """A number of the field's JSON type just or far outside ``lo..hi``, or a value of another type."""
    if integral:
        out = st.one_of(st.integers(max_value=int(lo) - 1), st.integers(min_value=int(hi) + 1))
        return st.one_of(out, _other_types(int))
    # nextafter, not exclude_max: -0.0 lies below 0.0 for Hypothesis, not for the readers' comparisons
    below = st.floats(max_value=math.nextafter(lo, -math.inf)) if lo > -math.inf else st.nothing()
    above = st.floats(min_value=math.nextafter(hi, math.inf)) if hi < math.inf else st.nothing()
    return st.one_of(below, above, st.sampled_from([math.nan, math.inf]), _other_types(int, float))


def _field_of(doc: dict[str, Any], rules: dict[str, Any], required: tuple[str, ...]) -> Any:
    """(what was changed, ``doc`` with one field out of its rule or removed)."""

    def change(key: str) -> Any:
        values = rules[key] if key not in required else st.one_of(rules[key], st.just(REMOVED))
        return values.map(lambda v: (key, v))

    def build(pair: tuple[str, Any]) -> tuple[str, dict[str, Any]]:
        key, value = pair
        out = {k: v for k, v in doc.items() if k != key}
        if value is REMOVED:
            return f"{key} removed", out
        out[key] = value
        return f"{key} = {value!r:.24}", out

    return st.sampled_from(sorted(rules)).flatmap(change).map(build)


def verdict_lines() -> Any:
    """A verdict line (analysis/incident_signatures.py's `read_verdicts` rules) with one field out of its rule;
    its ``unix`` a time."""
    rules = {
        "machine": _bad_text(1024),
        "verdict": st.one_of(st.text(max_size=20).filter(lambda w: w not in VERDICT_WORDS), _other_types(str)),
        "emulated": _bad_text(1024).filter(lambda v: v is not None),
        "repeats": _outside(1, 10_000, integral=True),
        "device": _bad_text(1024),
        "torch": _bad_text(1024),
        "unix": _outside(0.0, math.inf, integral=False),
    }
    required = ("machine", "verdict", "repeats", "device", "torch", "unix")
    return _field_of({**VERDICT, "unix": 1.0}, rules, required)


def map_places() -> Any:
    """A tolerance-map place (pipelines/tolerance.py's `parse_tolerance_map` rules, in a map of margin 2) with one
    field out of its rule."""
    rules = {
        "name": _bad_text(4096, least=1),
        "phase": st.one_of(st.text(max_size=12).filter(lambda w: w not in PHASES), _other_types(str)),
        "events": _outside(0, 1 << 62, integral=True),
        "max_ulps": _outside(0, 1 << 32, integral=True).filter(lambda v: v is not None),
        # past its range, or more than the 3 events that differed
        "ulp_events": st.one_of(_outside(0, 1 << 62, integral=True), st.integers(PLACE["events"] + 1, 1 << 62)),
        "max_rel_diff": _outside(0.0, math.inf, integral=False),
        "max_rel_error": _outside(0.0, math.inf, integral=False),
        # past its range, or wider than margin 2 x (2e-7 + the stats' rounding 4 x 2^-24) = 8.77e-7 allows
        "band": st.one_of(_outside(0.0, math.inf, integral=False), st.floats(min_value=8.8e-7, allow_infinity=False)),
    }
    required = ("name", "phase", "events", "ulp_events", "max_rel_diff", "max_rel_error", "band")
    return _field_of(PLACE, rules, required)
