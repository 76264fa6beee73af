"""The records an event log holds, as Python values.

A log is one `RunHeader` (everything needed to pair two runs), then a stream of
`TensorRecord` (the hot path: one per fingerprinted tensor) and `EventRecord`
(everything else), closed by an `EndRecord` when the writer shut down cleanly.
How they become bytes is codec.py's job; docs/log-format.md has the field-by-field
schema.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any, Literal, get_origin, get_type_hints

from tracer.errors import LogFormatError

# Version of what the records mean (header fields, event kinds). The byte layout has
# its own FORMAT_VERSION in framing.py; see docs/log-format.md for when each moves.
SCHEMA_VERSION = 1

EndStatus = Literal["complete", "failed"]
END_STATUSES: tuple[EndStatus, ...] = ("complete", "failed")


class Phase(IntEnum):
    """Where in a step a tensor was taken."""

    FORWARD = 0  # a traced site's forward output
    BACKWARD = 1  # gradient w.r.t. a traced site's input
    GRAD = 2  # a parameter's gradient before the optimizer step
    PARAM = 3  # a parameter after the optimizer step
    INPUT = 4  # the input batch


@dataclass(frozen=True, slots=True)
class RunHeader:
    """Who wrote a log and under which settings: the fields two runs must share to pair."""

    schema_version: int
    run_id: str
    node_label: str
    role: str  # "train", "replay", ...
    world_size: int
    rank: int
    config: dict[str, Any]  # the full training config as a plain dict
    config_fingerprint: str
    seed: int
    data_order_fingerprint: str
    fingerprint_algorithm: str
    versions: dict[str, str]  # python, torch, sdctrace, ...
    device: str
    determinism: dict[str, Any]  # intra-op threads, deterministic algorithms, ...
    created_unix: float
    extra: dict[str, Any]  # role-specific (fault profile, replay sources, ...)

    def to_dict(self) -> dict[str, Any]:
        """A plain (deep-copied) dict, the shape the HEADER record stores."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, source: str) -> RunHeader:
        """Check every field's presence and type, so a bad header fails here, naming `source`."""
        if not isinstance(d, dict):
            raise LogFormatError(f"{source}: run header must be a map, found {type(d).__name__}")
        missing = [name for name in _HEADER_TYPES if name not in d]
        if missing:
            raise LogFormatError(
                f"{source}: run header lacks field(s) {', '.join(missing)}: "
                "the log was not written by sdctrace or its header is damaged"
            )
        unknown = sorted(str(k) for k in d if k not in _HEADER_TYPES)
        if unknown:
            raise LogFormatError(
                f"{source}: run header has unknown field(s) {', '.join(unknown)} "
                f"(schema v{d.get('schema_version')}): written by a newer sdctrace? upgrade sdctrace"
            )
        values = {}
        for name, expected in _HEADER_TYPES.items():
            value = d[name]
            if expected is float and type(value) is int:
                value = float(value)
            if not isinstance(value, expected) or (expected is int and type(value) is bool):
                raise LogFormatError(
                    f"{source}: run header field {name!r} must be {expected.__name__}, "
                    f"found {type(value).__name__} {value!r:.80}"
                )
            values[name] = value
        if values["schema_version"] > SCHEMA_VERSION:
            raise LogFormatError(
                f"{source}: written by a newer sdctrace (schema v{values['schema_version']}, "
                f"this reader understands <= v{SCHEMA_VERSION}): upgrade sdctrace"
            )
        return cls(**values)


# dict[str, Any] -> dict: from_dict checks the container type, not its contents.
_HEADER_TYPES: dict[str, type] = {
    name: get_origin(hint) or hint for name, hint in get_type_hints(RunHeader).items()
}


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """One fingerprinted tensor; about 40 bytes on disk (docs/log-format.md)."""

    step: int
    microbatch: int
    name: str
    phase: Phase
    fingerprint: int  # unsigned 64-bit
    l2: float  # stored as float32
    absmax: float  # stored as float32
    nan: int  # count of NaN elements
    inf: int  # count of Inf elements
    meta: str  # dtype and shape, e.g. "float32[8,64,128]"


@dataclass(frozen=True, slots=True)
class EventRecord:
    """Everything that is not a tensor fingerprint: loss, step summary, checkpoint, blob, ..."""

    kind: str
    step: int
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EndRecord:
    """Written by a clean close; its absence marks a crashed run."""

    status: EndStatus  # "failed": the training raised but the writer closed cleanly
    records: int  # TENSOR and EVENT records written in the whole log
    detail: str = ""
