"""Incident bundles' defect signatures and reproduction verdicts, read and loaded into the study database.

    incident = read_bundle(Path("INC"))                 # a typed `Incident`; ValidationError naming file and field
    loaded = load_incidents("study.duckdb", [Path("INC-1"), Path("INC-2")])   # `sdc incident load`

A bundle is what `sdc incident` writes (docs/incident.md): its ``manifest.json`` (format ``sdctrace-incident/1``)
holds the site, the suspect and golden runs and the defect signature of each output that differs
(replay/signature.py's ``to_json``); its ``verdicts.jsonl`` the reproductions run so far, one JSON line each
(replay/bundle_reproduce.py's ``record_verdict``). Those files are replay's format; the analysis side imports no
replay, so this module is their reader here: it reads the few fields the tables hold, and trusts nothing in the
files (sizes, counts and string lengths are bounded, every type checked; an error names the file, the field and
the fix). The incident's id is 16 hex digits of the manifest's SHA-256, so a bundle and its copies are one
incident and two captures are two. Loading a bundle again replaces its signature rows and adds the verdicts not yet
loaded (each is keyed by its machine and time): a bundle copied to a healthy machine and back brings that
machine's verdicts beside the suspect's. All of it in one transaction (analysis/load.py's way).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.load import ensure_schema, rollback
from analysis.study_db import open_writable
from tracer.bounded_read import Bounds, digit_key, parse_json, read_bytes
from tracer.errors import ValidationError
from tracer.log.records import Phase

FORMAT = "sdctrace-incident/1"
MANIFEST, VERDICTS = "manifest.json", "verdicts.jsonl"
MANIFEST_BYTES = 256 << 20  # the op list of a large site runs to megabytes; no manifest sdctrace writes nears this
VERDICTS_BYTES = 4 << 20
MAX_SIGNATURES = 4096  # outputs of one site
MAX_VERDICTS = 10_000
MAX_TEXT = 1024  # characters of a name, label or id
JSON_TEXT = 1 << 16  # any string of the JSON (the fields the tables hold are bounded by MAX_TEXT, naming the field)
MAX_DIMS = 64
MAX_BITS = 64  # bit indices 0..63: float64 is the widest layout
# The dtypes a signature reads and their widths in bits (faults/corrupt.py's LAYOUTS, which replay/signature.py uses;
# tests/analysis/test_incident_signatures.py checks the two agree): a bit index is below its dtype's width.
WIDTHS = {"float64": 64, "float32": 32, "bfloat16": 16, "float16": 16}
PHASES = tuple(p.name.lower() for p in Phase)
MAX_SIZE = 1 << 40  # a dimension or an element count (DuckDB's BIGINT holds it; no tensor nears it)
# replay/bundle_reproduce.py's VERDICTS: the words a reproduction says, and its bounds on --repeats
VERDICT_WORDS = ("transient", "persistent here", "nondeterministic", "unexplained")
MAX_REPEATS = 10_000
_FIX = "capture it again with `sdc incident` (a bundle is never edited by hand)"
_FIX_VERDICT = "remove that line (reproduce.py appends one JSON object a line; run it again for a new one)"


@dataclass(frozen=True)
class OutputSignature:
    """One output's defect signature, the fields the table holds."""

    output: int
    op: str | None
    dtype: str
    shape: tuple[int, ...]
    shape_class: str
    elements: int
    differing: int
    fields: tuple[int, int, int]  # elements with a flip in the sign, the exponent, the mantissa
    bits: dict[int, int]  # bit index -> elements with it flipped
    ulps_max: float
    ulps_median: float
    period: int | None
    offset: int | None

    @property
    def top_bit(self) -> tuple[int, int] | None:
        """The most flipped bit and its count (the higher bit on a tie); None: no bit flipped."""
        if not self.bits:
            return None
        bit = max(self.bits, key=lambda b: (self.bits[b], b))
        return bit, self.bits[bit]


@dataclass(frozen=True)
class Verdict:
    """One reproduction of the bundle: where it ran and what it said."""

    machine: str
    verdict: str
    emulated: str | None  # the fault profile it ran under, or None: plain torch
    repeats: int
    device: str
    torch: str
    unix: float


@dataclass(frozen=True)
class Incident:
    """One bundle, as the tables hold it."""

    incident_id: str
    bundle: str
    node_label: str
    run_id: str | None
    golden_node: str | None
    golden_run_id: str | None
    step: int
    microbatch: int
    site: str
    phase: str
    signatures: tuple[OutputSignature, ...]
    verdicts: tuple[Verdict, ...]


class _Fields:
    """Typed, bounded access to one JSON object of ``path``; errors name the file and the field."""

    def __init__(self, path: Path, data: Any, where: str = "", fix: str = _FIX) -> None:
        self.path, self.data, self.where, self.fix = path, data, where, fix
        if not isinstance(data, dict):
            raise self.error(where or "the top level", f"is {type(data).__name__}, expected an object")

    def error(self, field: str, problem: str) -> ValidationError:
        return ValidationError(f"{self.path}: field {field} {problem}; {self.fix}")

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise self.error(self.name(key), "is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        if (
            isinstance(value, bool)
            and bool not in (kind if isinstance(kind, tuple) else (kind,))
            or not isinstance(value, kind)
        ):
            raise self.error(self.name(key), f"is {type(value).__name__}, expected {getattr(kind, '__name__', kind)}")
        return value

    def text(self, key: str, *, optional: bool = False) -> str | None:
        value = self.get(key, str, optional=optional)
        if value is not None and len(value) > MAX_TEXT:
            raise self.error(self.name(key), f"is {len(value)} characters long, at most {MAX_TEXT}")
        return value

    def count(self, key: str, *, optional: bool = False, low: int = 0, high: int = 1 << 62) -> int | None:
        value = self.get(key, int, optional=optional)
        if value is not None and not low <= value <= high:
            raise self.error(self.name(key), f"= {value} lies outside [{low}, {high}]")
        return value

    def word(self, key: str, words: tuple[str, ...]) -> str:
        value = self.get(key, str)
        if value not in words:
            raise self.error(self.name(key), f"= {value[:40]!r} is none of {', '.join(words)}")
        return value

    def number(self, key: str) -> float:
        try:
            value = float(self.get(key, (int, float)))
        except OverflowError:
            value = math.nan
        if math.isnan(value) or value < 0:
            raise self.error(self.name(key), f"= {value} is not a distance (>= 0)")
        return value

    def object(self, key: str) -> _Fields:
        return _Fields(self.path, self.get(key, dict), self.name(key), self.fix)

    def items(self, key: str, limit: int) -> list[Any]:
        value = self.get(key, list)
        if len(value) > limit:
            raise self.error(self.name(key), f"holds {len(value)} entries, at most {limit}")
        return value


def read_bundle(bundle: Path) -> Incident:
    """The incident in ``bundle``: its manifest's site, runs and signatures, and its verdicts so far."""
    path = bundle / MANIFEST
    raw = read_bytes(path, "bundle's manifest", MANIFEST_BYTES, _FIX, ValidationError)
    data = parse_json(raw, path, Bounds(file_bytes=MANIFEST_BYTES, text=JSON_TEXT), _FIX, ValidationError)
    manifest = _Fields(path, data)
    if data.get("format") != FORMAT:
        raise ValidationError(
            f"{path}: field format is {str(data.get('format'))[:40]!r}, this sdctrace reads "
            f"{FORMAT}; load it with the sdctrace that wrote it"
        )
    site, suspect, golden = manifest.object("site"), manifest.object("suspect"), manifest.object("golden")
    signatures = [
        _signature(_Fields(path, s, f"signatures[{i}]"))
        for i, s in enumerate(manifest.items("signatures", MAX_SIGNATURES))
    ]
    seen: set[int] = set()
    for i, sig in enumerate(signatures):
        if sig.output in seen:
            raise manifest.error(f"signatures[{i}].output", f"= {sig.output} names an output a signature named before")
        seen.add(sig.output)
    return Incident(
        incident_id=hashlib.sha256(raw).hexdigest()[:16],
        bundle=str(bundle),
        node_label=suspect.text("node_label"),
        run_id=suspect.text("run_id", optional=True),
        golden_node=golden.text("node_label", optional=True),
        golden_run_id=golden.text("run_id", optional=True),
        step=site.count("step"),
        microbatch=site.count("microbatch"),
        site=site.text("name"),
        phase=site.word("phase", PHASES),
        signatures=tuple(signatures),
        verdicts=tuple(read_verdicts(bundle / VERDICTS)),
    )


def _signature(sig: _Fields) -> OutputSignature:
    fields = sig.object("fields")
    bits = sig.object("bits")
    dtype = sig.word("dtype", tuple(WIDTHS))
    if len(bits.data) > MAX_BITS:
        raise sig.error(sig.name("bits"), f"holds {len(bits.data)} bits, at most {MAX_BITS}")
    counts = {}
    for key in bits.data:  # "02" beside "2" would count bit 2 twice
        if not (digit_key(key) and str(int(key)) == key and int(key) < WIDTHS[dtype]):
            raise sig.error(
                sig.name("bits"),
                f"has the key {key[:20]!r}, expected a bit index 0..{WIDTHS[dtype] - 1} of {dtype} (no leading zero)",
            )
        counts[int(key)] = bits.count(key)
    shape = sig.items("shape", MAX_DIMS)
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_SIZE for d in shape):
        raise sig.error(sig.name("shape"), f"is not a list of dimensions (integers from 0 to {MAX_SIZE})")
    grouped = sig.text("shape_class")
    if grouped != shape_class(shape):
        raise sig.error(
            sig.name("shape_class"), f"= {grouped[:40]!r} is not {shape_class(shape)!r}, the class of {shape}"
        )
    elements = sig.count("elements", high=MAX_SIZE)
    if math.prod(shape) != elements:
        raise sig.error(sig.name("elements"), f"= {elements} is not the product of the shape {shape}")
    differing = sig.count("differing", high=elements)
    flips = (fields.count("sign"), fields.count("exponent"), fields.count("mantissa"))
    # each differing element has at least one flipped bit, in at least one field; no count exceeds the elements
    if any(n > differing for n in (*counts.values(), *flips)) or (
        differing and (sum(counts.values()) < differing or sum(flips) < differing)
    ):
        raise sig.error(
            sig.name("bits"),
            f"and fields ({counts}, {flips}) do not fit {differing} differing elements (each has a flipped bit, "
            "none counts more than they)",
        )
    ulps_max, ulps_median = sig.number("ulps_max"), sig.number("ulps_median")
    if ulps_median > ulps_max:
        raise sig.error(sig.name("ulps_median"), f"= {ulps_median} exceeds ulps_max = {ulps_max}")
    period = sig.count("period", optional=True, low=1)
    offset = sig.count("offset", optional=True)
    if (period is None) != (offset is None) or (period is not None and offset is not None and offset >= period):
        raise sig.error(sig.name("offset"), f"= {offset} is no offset within period = {period} (both or neither)")
    return OutputSignature(
        output=sig.count("output", high=MAX_SIGNATURES),
        op=sig.text("op", optional=True),
        dtype=dtype,
        shape=tuple(shape),
        shape_class=grouped,
        elements=elements,
        differing=differing,
        fields=flips,
        bits=counts,
        ulps_max=ulps_max,
        ulps_median=ulps_median,
        period=period,
        offset=offset,
    )


def shape_class(shape: Sequence[int]) -> str:
    """replay/signature.py's shape class (``[3, 100]`` -> ``"4x128"``), which a signature's grouping trusts."""
    return "x".join(str(1 << max(0, (d - 1).bit_length())) if d else "0" for d in shape) or "scalar"


def read_verdicts(path: Path) -> list[Verdict]:
    """The verdicts of ``path`` (a bundle's verdicts.jsonl), oldest first; none when the file does not exist."""
    if not (path.exists() or path.is_symlink()):
        return []
    raw = read_bytes(path, "bundle's verdicts.jsonl", VERDICTS_BYTES, _FIX_VERDICT, ValidationError)
    lines = raw.split(b"\n")
    if len(lines) > MAX_VERDICTS:
        raise ValidationError(f"{path}: holds {len(lines)} lines, at most {MAX_VERDICTS}; keep the lines you need")
    found = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        bounds = Bounds(file_bytes=VERDICTS_BYTES, depth=4, text=JSON_TEXT)
        data = parse_json(line, f"{path}: line {n}", bounds, _FIX_VERDICT, ValidationError)
        v = _Fields(path, data, f"(line {n})", _FIX_VERDICT)
        verdict, repeats = v.word("verdict", VERDICT_WORDS), v.count("repeats", low=1, high=MAX_REPEATS)
        if verdict == "nondeterministic" and repeats < 2:
            raise v.error(v.name("repeats"), "= 1: one run cannot differ from another (nondeterministic needs 2)")
        found.append(
            Verdict(
                machine=v.text("machine"),
                verdict=verdict,
                emulated=v.text("emulated", optional=True),
                repeats=repeats,
                device=v.text("device"),
                torch=v.text("torch"),
                unix=v.number("unix"),
            )
        )
    return found


SIGNATURE_COLUMNS = 27
VERDICT_COLUMNS = 8


def load_incidents(db_path: str | Path, bundles: Sequence[Path]) -> list[Incident]:
    """Read every bundle (all before anything is written), then replace their rows in ``db_path`` in one
    transaction; the incidents loaded."""
    incidents = [read_bundle(b) for b in bundles]
    con = open_writable(db_path)
    try:
        con.execute("BEGIN TRANSACTION")
        ensure_schema(con)
        for inc in incidents:
            con.execute("DELETE FROM incident_signatures WHERE incident_id = ?", [inc.incident_id])
            if inc.signatures:
                con.executemany(
                    f"INSERT INTO incident_signatures VALUES ({', '.join('?' * SIGNATURE_COLUMNS)})",
                    list(_signature_rows(inc)),
                )
            for v in inc.verdicts:
                con.execute(
                    f"INSERT INTO incident_verdicts SELECT {', '.join('?' * VERDICT_COLUMNS)} WHERE NOT EXISTS "
                    "(SELECT 1 FROM incident_verdicts WHERE incident_id = ? AND machine = ? AND unix = ?)",
                    [
                        inc.incident_id,
                        v.machine,
                        v.verdict,
                        v.emulated,
                        v.repeats,
                        v.device,
                        v.torch,
                        v.unix,
                        inc.incident_id,
                        v.machine,
                        v.unix,
                    ],
                )
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise
    finally:
        con.close()
    return incidents


def _signature_rows(inc: Incident) -> Iterable[list[Any]]:
    for s in inc.signatures:
        top = s.top_bit
        yield [
            inc.incident_id,
            inc.bundle,
            inc.node_label,
            inc.run_id,
            inc.golden_node,
            inc.golden_run_id,
            inc.step,
            inc.microbatch,
            inc.site,
            inc.phase,
            s.output,
            s.op,
            s.dtype,
            list(s.shape),
            s.shape_class,
            s.elements,
            s.differing,
            *s.fields,
            top[0] if top else None,
            top[1] if top else None,
            s.bits,
            s.ulps_max,
            s.ulps_median,
            s.period,
            s.offset,
        ]
