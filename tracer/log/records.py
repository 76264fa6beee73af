"""The records an event log holds, as Python values.

A log is one `RunHeader` (everything needed to pair two runs), then a stream of
`TensorRecord` (the hot path: one per fingerprinted tensor) and `EventRecord`
(everything else), closed by an `EndRecord` when the writer shut down cleanly.
How they become bytes is codec.py's job; docs/log-format.md has the field-by-field
schema.
"""

from __future__ import annotations

import contextlib
import math
import operator
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any, Literal, final, get_origin, get_type_hints

from tracer.errors import LogFormatError, UsageError

# Version of what the records mean (header fields, event kinds). The byte layout has
# its own FORMAT_VERSION in framing.py; see docs/log-format.md for when each moves.
SCHEMA_VERSION = 2  # 2: a GRAD record's microbatch is the one whose backward last changed it, or NO_MICROBATCH

# Bounds on values read from a file, checked where bytes become objects, before anything is
# sized by them (docs/log-format.md, "Bounds"). A value beyond one is corruption, never data.
MAX_STEP = 1 << 40  # optimizer steps (and `--steps`): far beyond any training run
MAX_MICROBATCH = 1 << 20
# A GRAD record's microbatch when no microbatch's backward was the last to change the gradient (a gradient
# all-reduce at the step's end): after every microbatch of the step. The largest value the log stores; a training
# loop's microbatch index stays below it. Tables show it as null.
NO_MICROBATCH = MAX_MICROBATCH
MAX_WORLD_SIZE = 1 << 20  # ranks of one run
MAX_ELEMENTS = (1 << 63) - 1  # a tensor's NaN / Inf counts (int64)
MAX_STRING_ID = (1 << 32) - 1
MAX_BLOCK_ROWS = 1 << 16  # TENSOR records in one TENSOR_BLOCK
MAX_RECORDS = 1 << 48  # records in one log (HEADER first_record, END records)
MAX_CREATED_UNIX = float(1 << 34)  # seconds since the epoch: year 2514
MAX_DEPTH = 64  # nesting of maps and arrays in config, determinism, extra and event fields
U64_MAX = (1 << 64) - 1

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
        values: dict[str, Any] = {}  # each value checked against its field's type below
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
        problem = _header_problem(values)
        if problem:
            raise LogFormatError(
                f"{source}: run header field {problem}: the header is damaged or was not written by sdctrace"
            )
        return cls(**values)


# dict[str, Any] -> dict: from_dict checks the container type, not its contents.
_HEADER_TYPES: dict[str, type] = {name: get_origin(hint) or hint for name, hint in get_type_hints(RunHeader).items()}


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """One fingerprinted tensor; about 23 bytes on disk, as a row of a TENSOR_BLOCK (docs/log-format.md)."""

    step: int
    microbatch: int  # GRAD: the microbatch whose backward last changed it, or NO_MICROBATCH; PARAM: 0
    name: str
    phase: Phase
    fingerprint: int  # unsigned 64-bit
    l2: float  # stored as float32
    absmax: float  # stored as float32
    nan: int  # count of NaN elements
    inf: int  # count of Inf elements
    meta: str  # dtype and shape, e.g. "float32[8,64,128]"


def checked_index(what: str, value: object, limit: int) -> int:
    """A step or microbatch index as the int the log stores (a NumPy or torch integer from the loop's own
    counter included), refused where the loop gives it rather than at a later write."""
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError):  # no __index__, or a float or many-element tensor's
            index = operator.index(value)  # type: ignore[arg-type]  # any object: TypeError if it has no __index__
            if 0 <= index <= limit:
                return index
    raise UsageError(f"the {what} index must be an int in 0..{limit}, found {value!r} ({type(value).__name__})")


def describe_microbatch(microbatch: int) -> str:
    """``microbatch N``, or what NO_MICROBATCH means, for messages."""
    return "after every microbatch" if microbatch == NO_MICROBATCH else f"microbatch {microbatch}"


@final  # `type(r) is EventRecord` then tells the checker what else r is
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


def nesting_depth_over(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether maps and arrays in `value` nest deeper than `limit` (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, (list, tuple)):
            continue
        if depth > limit:
            return True
        stack.extend((item, depth + 1) for item in v)
    return False


def _is_int(v: Any) -> bool:
    return type(v) is int


def _header_problem(h: dict[str, Any]) -> str | None:
    """What is out of range or inconsistent in a run header whose field types are right; None if nothing."""
    world, rank, created = h["world_size"], h["rank"], h["created_unix"]
    if h["schema_version"] < 1:
        return f"'schema_version' must be >= 1, found {h['schema_version']}"
    if not 1 <= world <= MAX_WORLD_SIZE:
        return f"'world_size' must be in 1..{MAX_WORLD_SIZE}, found {world}"
    if not 0 <= rank < world:
        return f"'rank' must be in 0..world_size-1 = {world - 1}, found {rank}"
    if not -(1 << 63) <= h["seed"] <= U64_MAX:
        return f"'seed' must fit 64 bits, found {h['seed']:.3g}"
    if not (math.isfinite(created) and 0 <= created <= MAX_CREATED_UNIX):
        return f"'created_unix' must be a finite time in 0..{MAX_CREATED_UNIX:.0f} s since the epoch, found {created!r}"
    bad = next((k for k, v in h["versions"].items() if not isinstance(k, str) or not isinstance(v, str)), None)
    if bad is not None:
        return f"'versions' must map str to str, found {bad!r}: {h['versions'][bad]!r:.80}"
    for name in ("config", "determinism", "extra"):
        if nesting_depth_over(h[name]):
            return f"{name!r} nests deeper than {MAX_DEPTH} levels"
    return _extra_problem(h["extra"], world)


def _extra_problem(extra: dict[str, Any], world: int) -> str | None:
    """The `extra` entries readers rely on: `sites`, `sites_without_backward`, `parallel`."""
    sites = extra.get("sites")
    if sites is not None and not (isinstance(sites, list) and all(isinstance(s, str) for s in sites)):
        return f"'extra.sites' must be a list of str (traced module paths), found {type(sites).__name__} {sites!r:.80}"
    nb = extra.get("sites_without_backward")
    if nb is not None and not (isinstance(nb, dict) and all(isinstance(v, str) for v in nb.values())):
        return f"'extra.sites_without_backward' must map site to reason (str), found {nb!r:.80}"
    par = extra.get("parallel")
    if par is None:
        return None
    if (
        not isinstance(par, dict)
        or not all(_is_int(par.get(k)) and par[k] >= 1 for k in ("dp", "tp"))
        or not isinstance(par.get("sp", False), bool)
    ):
        return f"'extra.parallel' must be {{dp: int >= 1, tp: int >= 1, sp: bool, coords}}, found {par!r:.80}"
    pp = par.get("pp", 1)
    if not _is_int(pp) or pp < 1:
        return f"'extra.parallel.pp' must be an int >= 1 (pipeline stages), found {pp!r:.80}"
    if par["dp"] * par["tp"] * pp != world:
        stages = f" x pp {pp}" if pp != 1 else ""
        return f"'extra.parallel' says dp {par['dp']} x tp {par['tp']}{stages} ranks, but 'world_size' is {world}"
    return None
