"""msgpack payloads of each record type, shared by the writer and the reader.

HEADER, EVENT and END are maps packed with float64, so a config's learning rate
reads back bit for bit; TENSOR is a positional array packed with float32 to stay
small; STRING is ``[id, text]``. Decoders check shape and types and raise
`PayloadError`; the reader reports it with file and offset, the writer uses the same
decoders to refuse records it could not read back. msgpack decoding builds plain
values only (no pickle, no object hooks); its size limits default to the payload's
length, itself at most MAX_RECORD_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import msgpack

from tracer.log.records import (
    END_STATUSES,
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_MICROBATCH,
    MAX_RECORDS,
    MAX_STEP,
    MAX_STRING_ID,
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
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise PayloadError(f"payload is not valid msgpack: {e}") from None


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
    if not (isinstance(m, list) and len(m) == 2 and _is_int(m[0]) and 0 <= m[0] <= MAX_STRING_ID
            and isinstance(m[1], str)):
        raise PayloadError(f"STRING payload must be [id in 0..{MAX_STRING_ID}, text], found {m!r:.80}")
    return m[0], m[1]


TensorEncoder = Callable[[TensorRecord, int, int], bytes]


def tensor_encoder() -> TensorEncoder:
    """Packs TENSOR payloads with one reused float32 packer: the writer's hot path."""
    pack = msgpack.Packer(use_single_float=True).pack

    def encode(r: TensorRecord, name_id: int, meta_id: int) -> bytes:
        return pack((r.step, r.microbatch, name_id, r.phase, r.fingerprint, r.l2, r.absmax, r.nan, r.inf, meta_id))

    return encode


def decode_tensor(payload: Any, strings: Mapping[int, str]) -> TensorRecord:
    """`strings`: the ids this segment's STRING records defined so far."""
    try:
        step, microbatch, name_id, phase, fingerprint, l2, absmax, nan, inf, meta_id = _unpack_array(payload)
    except (ValueError, TypeError, msgpack.UnpackException):
        raise PayloadError(
            "TENSOR payload must be a 10-element array [step, microbatch, name_id, phase, "
            "fingerprint, l2, absmax, nan, inf, meta_id]"
        ) from None
    if not (type(step) is int and 0 <= step <= MAX_STEP and type(microbatch) is int and 0 <= microbatch <= MAX_MICROBATCH
            and type(fingerprint) is int and 0 <= fingerprint <= U64_MAX and type(l2) is float
            and type(absmax) is float and type(nan) is int and 0 <= nan <= MAX_ELEMENTS
            and type(inf) is int and 0 <= inf <= MAX_ELEMENTS and type(name_id) is int and type(meta_id) is int):
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
            ok = type(value) is int and (check is None or check(value))
        _check(ok, "TENSOR", field, expected, value)


# Fields of event kinds that readers use by name: (kind, field) -> (what it must be, check). A field is
# checked when present; `_REQUIRED` ones must be there (a `blob` event is a reference into the blob store).
def _int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


_EVENT_FIELDS: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "blob": {
        "microbatch": (f"an int in 0..{MAX_MICROBATCH}", _int_in(0, MAX_MICROBATCH)),
        "name": ("a str", lambda v: isinstance(v, str)),
        "phase": (f"a phase, one of {sorted(_PHASES)}", lambda v: type(v) is int and v in _PHASES),
        "fingerprint": ("an unsigned 64-bit int", _int_in(0, U64_MAX)),
    },
    "checkpoint": {"rank": ("an int >= 0", _int_in(0, 1 << 20))},
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
    m = _map(payload, "EVENT", ("kind", "step", "fields"))
    kind, step, fields = m["kind"], m["step"], m["fields"]
    check_event(kind, step, fields)
    return EventRecord(kind, step, fields)


def encode_end(rec: EndRecord) -> bytes:
    return msgpack.packb({"status": rec.status, "records": rec.records, "detail": rec.detail})


def decode_end(payload: Any) -> EndRecord:
    m = _map(payload, "END", ("status", "records", "detail"))
    status, records, detail = m["status"], m["records"], m["detail"]
    _check(status in END_STATUSES, "END", "status", f"one of {list(END_STATUSES)}", status)
    _check(_is_int(records) and 0 <= records <= MAX_RECORDS, "END", "records", f"an int in 0..{MAX_RECORDS}", records)
    _check(isinstance(detail, str), "END", "detail", "str", detail)
    return EndRecord(status, records, detail)
