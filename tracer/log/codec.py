"""msgpack payloads of each record type, shared by the writer and the reader.

HEADER, EVENT and END are maps packed with float64, so a config's learning rate
reads back bit for bit; TENSOR is a positional array packed with float32 to stay
small; TENSOR_BLOCK holds TENSOR records of one step as columns of fixed-width
little-endian values, in a msgpack array in format v2 (here) and in a checked binary
layout from v3 on (`tracer.log.checked_block`, which shares `block_records`); STRING
is ``[id, text]``. Decoders check shape and types and raise `PayloadError`; the
reader reports it with file and offset, the writer uses the same decoders to refuse
records it could not read back. msgpack decoding builds plain values only (no
pickle, no object hooks); its size limits default to the payload's length, itself at
most MAX_RECORD_BYTES; a block's row count is bounded (MAX_BLOCK_ROWS) and checked
against its columns' lengths.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import msgpack

from tracer.log.records import (
    END_STATUSES,
    MAX_BLOCK_ROWS,
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_MICROBATCH,
    MAX_RECORDS,
    MAX_STEP,
    MAX_STRING_ID,
    MAX_WORLD_SIZE,
    U64_MAX,
    EndRecord,
    EventRecord,
    Phase,
    RunHeader,
    TensorRecord,
    nesting_depth_over,
)


class PayloadError(ValueError):
    """A payload with a valid CRC that does not decode to its record type."""


_PHASES = {p.value: p for p in Phase}


_unpack_array = partial(msgpack.unpackb, raw=False, use_list=False)  # tuples: the read hot path


def _unpack(payload: Any) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False)
    except msgpack.StackError:  # its message is empty
        raise PayloadError("payload is not valid msgpack: maps and arrays nested too deeply") from None
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise PayloadError(f"payload is not valid msgpack: {str(e) or type(e).__name__}") from None


def _map(payload: Any, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    m = _unpack(payload)
    if not isinstance(m, dict) or set(m) != set(keys):
        found = sorted(map(str, m)) if isinstance(m, dict) else type(m).__name__
        raise PayloadError(f"{what} payload must be a map with keys {list(keys)}, found {found}")
    return m


def _check(ok: bool, what: str, field: str, expected: str, value: Any) -> None:
    if not ok:
        raise PayloadError(f"{what} field {field!r} must be {expected}, found {type(value).__name__} {value!r:.80}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def encode_header(header: RunHeader, first_record: int) -> bytes:
    """`first_record`: records written before this segment, so readers can check that segments chain."""
    return msgpack.packb({"run": header.to_dict(), "first_record": first_record})


def decode_header(payload: Any, source: str) -> tuple[RunHeader, int]:
    m = _map(payload, "HEADER", ("run", "first_record"))
    first = m["first_record"]
    _check(_is_int(first) and 0 <= first <= MAX_RECORDS, "HEADER", "first_record", f"an int in 0..{MAX_RECORDS}", first)
    return RunHeader.from_dict(m["run"], source), first


def encode_string(string_id: int, text: str) -> bytes:
    return msgpack.packb((string_id, text))


def decode_string(payload: Any) -> tuple[int, str]:
    m = _unpack(payload)
    if not (
        isinstance(m, list) and len(m) == 2 and _is_int(m[0]) and 0 <= m[0] <= MAX_STRING_ID and isinstance(m[1], str)
    ):
        raise PayloadError(f"STRING payload must be [id in 0..{MAX_STRING_ID}, text], found {m!r:.80}")
    return m[0], m[1]


Row = tuple[int, int, int, int, float, float, int, int, int]  # a TENSOR record less its step, ids for strings


def encode_tensor(step: int, row: Row) -> bytes:
    """One record as a TENSOR payload: what the writer stores for a block of one row, which is smaller."""
    mb, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id = row
    return msgpack.packb(
        (step, mb, name_id, phase, fingerprint, in_float32(l2), in_float32(absmax), nan, inf, meta_id),
        use_single_float=True,
    )


_FLOAT32_INF = 2.0**128 - 2.0**103  # the doubles from here on round to inf as float32


def in_float32(v: float) -> float:
    """Beyond float32's range: ±inf, which is what it rounds to (struct and msgpack refuse to round it)."""
    return math.copysign(math.inf, v) if abs(v) >= _FLOAT32_INF else v


def decode_tensor(payload: Any, strings: Mapping[int, str]) -> TensorRecord:
    """`strings`: the ids this segment's STRING records defined so far."""
    try:
        step, microbatch, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id = _unpack_array(payload)
    except (ValueError, TypeError, msgpack.UnpackException):
        raise PayloadError(
            "TENSOR payload must be a 10-element array [step, microbatch, name_id, phase, "
            "fingerprint, l2, absmax, nan, inf, meta_id]"
        ) from None
    if not (
        type(step) is int
        and 0 <= step <= MAX_STEP
        and type(microbatch) is int
        and 0 <= microbatch <= MAX_MICROBATCH
        and type(fingerprint) is int
        and 0 <= fingerprint <= U64_MAX
        and type(l2) is float
        and type(absmax) is float
        and type(nan) is int
        and 0 <= nan <= MAX_ELEMENTS
        and type(inf) is int
        and 0 <= inf <= MAX_ELEMENTS
        and type(name_id) is int
        and type(meta_id) is int
    ):
        _tensor_problem(step, microbatch, name_id, fingerprint, l2, absmax, nan, inf, meta_id)
    try:
        name, meta = strings[name_id], strings[meta_id]
    except (KeyError, TypeError):
        missing = meta_id if isinstance(name_id, int) and name_id in strings else name_id
        raise PayloadError(
            f"TENSOR refers to string id {missing!r}, which no earlier STRING record in this "
            "segment defines (that STRING record was lost to corruption)"
        ) from None
    try:
        phase = _PHASES[phase]
    except (KeyError, TypeError):
        raise PayloadError(f"TENSOR phase must be one of {sorted(_PHASES)}, found {phase!r:.80}") from None
    return TensorRecord(step, microbatch, name, phase, fingerprint, l2, absmax, nan, inf, meta)


_TENSOR_FIELDS = (  # (field, what it must be, check) for TENSOR's checked fields, in payload order
    ("step", f"an int in 0..{MAX_STEP}", lambda v: 0 <= v <= MAX_STEP),
    ("microbatch", f"an int in 0..{MAX_MICROBATCH}", lambda v: 0 <= v <= MAX_MICROBATCH),
    ("name_id", "an int", None),
    ("fingerprint", "an unsigned 64-bit int", lambda v: 0 <= v <= U64_MAX),
    ("l2", "a float", float),
    ("absmax", "a float", float),
    ("nan", f"an int in 0..{MAX_ELEMENTS}", lambda v: 0 <= v <= MAX_ELEMENTS),
    ("inf", f"an int in 0..{MAX_ELEMENTS}", lambda v: 0 <= v <= MAX_ELEMENTS),
    ("meta_id", "an int", None),
)


def _tensor_problem(*values: Any) -> None:
    """Raise the PayloadError naming the first TENSOR field that is ill-typed or out of range."""
    for (field, expected, check), value in zip(_TENSOR_FIELDS, values):
        if check is float:
            ok = type(value) is float
        else:
            ok = type(value) is int and (check is None or bool(check(value)))
        _check(ok, "TENSOR", field, expected, value)


# -- TENSOR_BLOCK ------------------------------------------------------------------------------

# The columns after [step, rows], in payload order: (field, float32 column?, largest value; None: any).
# Integer columns are unsigned, of one width per column: 1, 2, 4 or 8 bytes, or 0 when every value is 0.
BLOCK_COLUMNS: tuple[tuple[str, bool, int | None], ...] = (
    ("microbatch", False, MAX_MICROBATCH),
    ("name_id", False, None),
    ("phase", False, int(max(Phase))),
    ("fingerprint", False, None),
    ("l2", True, None),
    ("absmax", True, None),
    ("nan", False, MAX_ELEMENTS),
    ("inf", False, MAX_ELEMENTS),
    ("meta_id", False, None),
)
BLOCK_WIDTHS = (0, 1, 2, 4, 8)
_UINT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_BLOCK_SHAPE = (
    "TENSOR_BLOCK payload must be an 11-element array [step, rows, "
    + ", ".join(name for name, _, _ in BLOCK_COLUMNS)
    + "] whose last 9 are bin columns"
)


def uint_column(values: Sequence[int]) -> bytes:
    """A block's integer column: the smallest of `BLOCK_WIDTHS` that holds every value, little-endian."""
    top = max(values)
    if top == 0:
        return b""
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    return struct.pack(f"<{len(values)}{_UINT_CODES[width]}", *values)


def float32_column(values: Sequence[float]) -> bytes:
    """A block's float column: float32, little-endian, a value beyond float32's range as the inf it rounds to."""
    try:
        return struct.pack(f"<{len(values)}f", *values)
    except OverflowError:
        return struct.pack(f"<{len(values)}f", *map(in_float32, values))


def decode_tensor_block(payload: Any, strings: Mapping[int, str]) -> list[TensorRecord]:
    """The block's records, each checked as `decode_tensor` checks a TENSOR; `strings` as there."""
    step, rows, columns = _block_head(payload)
    return block_records(step, rows, columns, strings)


def block_records(step: int, rows: int, columns: Sequence[Any], strings: Mapping[int, str]) -> list[TensorRecord]:
    """The records of a block of `rows` rows at `step` from its 9 column byte strings (`BLOCK_COLUMNS`' order),
    each checked as `decode_tensor` checks a TENSOR: what TENSOR_BLOCKs of every format version share."""
    values: list[Sequence[Any]] = []
    for (field, is_float, top), column in zip(BLOCK_COLUMNS, columns):
        width, extra = divmod(len(column), rows)
        if (width != 4 if is_float else width not in BLOCK_WIDTHS) or extra:
            expected = "float32 values (4 bytes each)" if is_float else "unsigned ints of 0, 1, 2, 4 or 8 bytes each"
            raise PayloadError(
                f"TENSOR_BLOCK field {field!r} must hold {rows} {expected}, found a column of {len(column)} bytes"
            )
        if is_float:
            values.append(struct.unpack(f"<{rows}f", column))
            continue
        ints = struct.unpack(f"<{rows}{_UINT_CODES[width]}", column) if width else (0,) * rows
        if top is not None and max(ints) > top:
            row = next(i for i, v in enumerate(ints) if v > top)
            raise PayloadError(
                f"TENSOR_BLOCK field {field!r} must be an int in 0..{top}, found {ints[row]} in row {row}"
            )
        values.append(ints)
    microbatch, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id = values
    try:
        names, metas = [strings[i] for i in name_id], [strings[i] for i in meta_id]
    except KeyError as e:
        raise PayloadError(
            f"TENSOR_BLOCK refers to string id {e.args[0]!r}, which no earlier STRING record in this "
            "segment defines (that STRING record was lost to corruption)"
        ) from None
    phases = [_PHASES[p] for p in phase]
    return list(map(TensorRecord, (step,) * rows, microbatch, names, phases, fingerprint, l2, absmax, nan, inf, metas))


def block_rows(payload: Any) -> int | None:
    """How many records a TENSOR_BLOCK says it holds; None if not even that reads."""
    try:
        return _block_head(payload)[1]
    except PayloadError:
        return None


def _block_head(payload: Any) -> tuple[int, int, tuple[bytes, ...]]:
    try:
        value = _unpack_array(payload)
    except (ValueError, TypeError, msgpack.UnpackException):
        value = None
    if type(value) is not tuple or len(value) != 2 + len(BLOCK_COLUMNS) or not all(type(c) is bytes for c in value[2:]):
        raise PayloadError(_BLOCK_SHAPE)
    step, rows = value[:2]
    _check(_is_int(step) and 0 <= step <= MAX_STEP, "TENSOR_BLOCK", "step", f"an int in 0..{MAX_STEP}", step)
    _check(
        _is_int(rows) and 1 <= rows <= MAX_BLOCK_ROWS, "TENSOR_BLOCK", "rows", f"an int in 1..{MAX_BLOCK_ROWS}", rows
    )
    return step, rows, value[2:]


# Fields of event kinds that readers use by name: (kind, field) -> (what it must be, check). A field is
# checked when present; `_REQUIRED` ones must be there (a `blob` event is a reference into the blob store).
# Every integer field any reader uses is bounded here by what its column in the diff's tables holds
# (pipelines/tables.py: int32 or int64; fingerprints uint64), so the reader, `sdc inspect` and the diff accept
# exactly the same records; the diff then only reads leniently what is absent or of another type.
def _int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _or_nil(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _ints_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is list and all(type(x) is int and lo <= x <= hi for x in v)


def _is_number(v: Any) -> bool:  # a float64 column takes any int msgpack holds
    return type(v) in (int, float)


def _maps_of(spec: Mapping[str, Callable[[Any], bool]]) -> Callable[[Any], bool]:
    """A list of maps whose listed keys, where present, pass their check."""
    return lambda v: (
        type(v) is list and all(type(m) is dict and all(k not in m or ok(m[k]) for k, ok in spec.items()) for m in v)
    )


I64_MAX = (1 << 63) - 1  # an int64 column's largest value
I32_MAX = (1 << 31) - 1  # an int32 column's
_MICROBATCH = (f"an int in 0..{MAX_MICROBATCH} or nil", _or_nil(_int_in(0, MAX_MICROBATCH)))
_COUNT = (f"an int in 0..{MAX_ELEMENTS} or nil", _or_nil(_int_in(0, MAX_ELEMENTS)))
_FINGERPRINT = ("an unsigned 64-bit int", _int_in(0, U64_MAX))
_RANK = (f"an int in 0..{MAX_WORLD_SIZE - 1}", _int_in(0, MAX_WORLD_SIZE - 1))
_RANKS = (f"a list of ints in 0..{MAX_WORLD_SIZE - 1}", _or_nil(_ints_in(0, MAX_WORLD_SIZE - 1)))
_NUMBER = ("a number or nil", _or_nil(_is_number))
_ALARMS = (
    "a list of maps {detector, measured, threshold, detail} whose numbers are numbers or nil",
    _or_nil(_maps_of({"measured": _NUMBER[1], "threshold": _NUMBER[1]})),
)
_RUNS = (
    f"a list of maps {{attempt: int in 0..{I64_MAX}, fingerprint: uint64, loss, grad_norm: number or nil, "
    f"nonfinite: int in 0..{MAX_ELEMENTS}, events: map of str to int in 0..{I64_MAX}}}",
    _or_nil(
        _maps_of(
            {
                "attempt": _int_in(0, I64_MAX),
                "fingerprint": _FINGERPRINT[1],
                "loss": _NUMBER[1],
                "grad_norm": _NUMBER[1],
                "nonfinite": _int_in(0, MAX_ELEMENTS),
                "events": lambda v: type(v) is dict and all(type(n) is int and 0 <= n <= I64_MAX for n in v.values()),
            }
        )
    ),
)
_EVENT_FIELDS: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "blob": {
        "microbatch": (f"an int in 0..{MAX_MICROBATCH}", _int_in(0, MAX_MICROBATCH)),
        "name": ("a str", lambda v: isinstance(v, str)),
        "phase": (f"a phase, one of {sorted(_PHASES)}", lambda v: type(v) is int and v in _PHASES),
        "fingerprint": _FINGERPRINT,
    },
    "checkpoint": {"rank": _RANK},
    "resume": {"rank": _RANK, "last_step": (f"an int in 0..{MAX_STEP} or nil", _or_nil(_int_in(0, MAX_STEP)))},
    "step": {
        "loss": _NUMBER,
        "wall_s": _NUMBER,
        "grad_norm": _NUMBER,
        "microbatches": (f"an int in 0..{MAX_MICROBATCH + 1}", _int_in(0, MAX_MICROBATCH + 1)),
    },
    "loss": {"microbatch": _MICROBATCH, "loss": _NUMBER},
    "rng": {"fingerprint": _FINGERPRINT, "devices": ("an int in 0..65535", _int_in(0, (1 << 16) - 1))},
    "fault": {
        "microbatch": _MICROBATCH,
        "elements": _COUNT,
        "index": (f"a list of ints in 0..{MAX_ELEMENTS}", _or_nil(_ints_in(0, MAX_ELEMENTS))),
    },
    "abft": {
        "microbatch": _MICROBATCH,
        "shape": (f"a list of ints in 0..{MAX_ELEMENTS}", _or_nil(_ints_in(0, MAX_ELEMENTS))),
    },
    "site_mismatch": {"microbatch": _MICROBATCH, "elements": _COUNT, "mismatched": _COUNT, "zero_golden": _COUNT},
    "replay_divergence": {"microbatch": _MICROBATCH, "expected": _FINGERPRINT, "found": _FINGERPRINT},
    "sharpness": {"microbatch": _MICROBATCH, "iterations": _COUNT},
    "finetune_eval": {"examples": _COUNT, "correct": _COUNT},
    "finetune_prediction": {
        "example": _COUNT,
        "predicted": (f"an int in 0..{I32_MAX} or nil", _or_nil(_int_in(0, I32_MAX))),
        "answer": (f"an int in 0..{I32_MAX} or nil", _or_nil(_int_in(0, I32_MAX))),
    },
    "guard": {
        "accepted": (f"an int in 0..{I64_MAX} or nil", _or_nil(_int_in(0, I64_MAX))),
        "alarms": _ALARMS,
        "runs": _RUNS,
    },
    "replicas": {"measured": _NUMBER, "threshold": _NUMBER, "replicas": _RANKS, "ranks": _RANKS},
}
_REQUIRED = {"blob": ("microbatch", "name", "phase", "fingerprint")}


def check_event(kind: Any, step: Any, fields: Any) -> None:
    """The EVENT schema: PayloadError naming the first field that is ill-typed, out of range or missing."""
    _check(isinstance(kind, str), "EVENT", "kind", "str", kind)
    _check(_is_int(step) and 0 <= step <= MAX_STEP, "EVENT", "step", f"an int in 0..{MAX_STEP}", step)
    _check(isinstance(fields, dict), "EVENT", "fields", "a map", fields)
    if nesting_depth_over(fields):
        raise PayloadError(f"EVENT {kind!r:.40} field 'fields' nests deeper than {MAX_DEPTH} levels")
    for name in _REQUIRED.get(kind, ()):
        if name not in fields:
            raise PayloadError(f"EVENT {kind!r} field 'fields.{name}' is missing")
    for name, (expected, ok) in _EVENT_FIELDS.get(kind, {}).items():
        if name in fields:
            _check(ok(fields[name]), f"EVENT {kind!r}", f"fields.{name}", expected, fields[name])


def encode_event(rec: EventRecord) -> bytes:
    # Nested "fields", so an event's own field names can never collide with kind/step.
    return msgpack.packb({"kind": rec.kind, "step": rec.step, "fields": rec.fields})


def decode_event(payload: Any) -> EventRecord:
    """The EVENT record, checked against `check_event`'s schema; the checks are short-cut for the shape nearly
    every event has, since the reader decodes millions of them and the writer decodes each one it writes."""
    try:
        m = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        m = None
    if (
        type(m) is dict
        and len(m) == 3
        and type(m.get("kind")) is str
        and type(m.get("step")) is int
        and type(m.get("fields")) is dict
    ):
        kind, step, fields = m["kind"], m["step"], m["fields"]
        if kind in _CHECKED_KINDS or step < 0 or step > MAX_STEP or _nested(fields):
            check_event(kind, step, fields)
        return EventRecord(kind, step, fields)  # nothing in `check_event` could fail
    m = _map(payload, "EVENT", ("kind", "step", "fields"))  # raises the PayloadError that says what is wrong
    kind, step, fields = m["kind"], m["step"], m["fields"]
    check_event(kind, step, fields)
    return EventRecord(kind, step, fields)


_CHECKED_KINDS = frozenset(_EVENT_FIELDS) | frozenset(_REQUIRED)  # kinds with fields `check_event` checks
assert MAX_DEPTH >= 3, MAX_DEPTH  # `_nested` stops looking at the third level


_SCALARS = frozenset({type(None), bool, int, float, str})


def reads_back(rec: EventRecord) -> bool:
    """Whether ``rec`` is sure to decode as it was written (once msgpack has packed it) without decoding it: a kind
    with no required fields, a step in range, under str keys only scalars and lists of scalars (the shape nearly
    every event has), and the kind's checked fields in bounds. The writer decodes the others to refuse what would
    not read back."""
    kind, step, fields = rec.kind, rec.step, rec.fields
    if (
        type(kind) is not str
        or kind in _REQUIRED
        or type(step) is not int
        or not 0 <= step <= MAX_STEP
        or type(fields) is not dict
    ):
        return False
    for k, v in fields.items():
        if (
            type(k) is not str
            or type(v) not in _SCALARS
            and (type(v) is not list or any(type(x) not in _SCALARS for x in v))
        ):
            return False
    return all(ok(fields[name]) for name, (_, ok) in _EVENT_FIELDS.get(kind, {}).items() if name in fields)


def _nested(fields: dict[str, Any]) -> bool:
    """Whether a value of `fields` may hold a container (then `check_event` measures the nesting): events are
    mostly scalars and lists of scalars, whose depth is at most 3. True for anything else, which only costs the
    full check."""
    for v in fields.values():
        t = type(v)
        if t not in _SCALARS and (t is not list or not _SCALARS.issuperset(map(type, v))):
            return True
    return False


def encode_end(rec: EndRecord) -> bytes:
    return msgpack.packb({"status": rec.status, "records": rec.records, "detail": rec.detail})


def decode_end(payload: Any) -> EndRecord:
    m = _map(payload, "END", ("status", "records", "detail"))
    status, records, detail = m["status"], m["records"], m["detail"]
    _check(status in END_STATUSES, "END", "status", f"one of {list(END_STATUSES)}", status)
    _check(_is_int(records) and 0 <= records <= MAX_RECORDS, "END", "records", f"an int in 0..{MAX_RECORDS}", records)
    _check(isinstance(detail, str), "END", "detail", "str", detail)
    return EndRecord(status, records, detail)
