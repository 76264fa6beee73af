"""Check an incident bundle before anything in it is used: the bundle as data from elsewhere.

    bundle = load(Path("INC"))     # a `Bundle`: every file and field checked; BundleError names the first problem
    bundle.ops[0].func             # torch.ops.aten.t.default, resolved through torch's operator registry

A bundle is data from elsewhere, and nothing in it is imported, loaded or called but torch operators. Before a
tensor is read, `load` checks the whole bundle: each file is a regular file of bounded size whose SHA-256 is the
one the manifest records; the manifest is JSON of bounded depth, size and integers, without duplicate keys or
lone surrogates; every op name is ``aten.<op>.<overload>`` or ``prims.<op>.<overload>`` and resolves, through
torch's operator registry only, to an ``OpOverload`` (never an attribute walk from a name the file chose; no op
that reads a file); every dtype, layout and memory format is one of torch's; every tensor an op reads exists
before it, and every stored tensor has the dtype and shape its bytes fit; ops that draw random numbers have the
RNG state the forward began with. Each op's results must have the shapes
and dtypes the manifest records. A bundle that fails any check is refused (exit 2) with one line naming the file,
the field and the fix, never given a verdict. The bundle's own ``reproduce.py`` is its own code, which a bundle
from elsewhere may have changed: run such a bundle with the installed ``sdc incident reproduce BUNDLE``, which
imports this module and never the bundle's script.

This module imports only torch, the standard library and tracer/bounded_read.py (the one reader of JSON from
elsewhere, itself standard library only): a bundle carries copies of both, ``bundle_check.py`` and
``bounded_read.py``, beside its ``reproduce.py`` (replay/bundle_reproduce.py), which runs what `load` returns.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING or __package__:  # sdctrace's replay.bundle_check
    from tracer.bounded_read import Bounds, SdcError, read_bytes
    from tracer.bounded_read import parse_json as parse_bounded
else:  # a bundle's bundle_check.py: the reader the bundle carries beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bounded_read import Bounds, SdcError, read_bytes
    from bounded_read import parse_json as parse_bounded

MANIFEST, TENSORS, VERDICTS_FILE = "manifest.json", "tensors.safetensors", "verdicts.jsonl"
CHECKER = "bundle_check.py"  # this module, as a bundle carries it beside reproduce.py
READER = "bounded_read.py"  # tracer/bounded_read.py, which this module reads every JSON text with
FORMAT = "sdctrace-incident/1"
# safetensors' dtype codes (little-endian data)
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

# Bounds on what a bundle may ask for, checked before it is read or used.
MANIFEST_BYTES = 256 << 20  # the op list of a large site runs to megabytes
TENSOR_BYTES = 16 << 30  # one site's inputs, parameters, constants and two outputs
HEADER_BYTES = 100 << 20  # a safetensors header (what safetensors itself accepts)
MAX_DEPTH = 32  # JSON nesting: an op argument is a list of lists at most a few deep
MAX_INT_DIGITS = 20  # an integer in the manifest fits int64 (a seed, a size, a stride)
MAX_TEXT = 4096  # characters of a name, a reference or a string argument
MAX_DIMS = 64
MIN_ELEMENTS = 1 << 24  # an op may always make this many elements
MAX_GROWTH = 1024  # ... or this many times the largest tensor the bundle holds (attention scores outgrow inputs)
JSON_BOUNDS = Bounds(file_bytes=MANIFEST_BYTES, depth=MAX_DEPTH, text=MAX_TEXT, int_digits=MAX_INT_DIGITS)

# Ops resolve only in these namespaces of torch's operator registry: what a forward's TorchDispatchMode records.
NAMESPACES = {"aten": torch.ops.aten, "prims": torch.ops.prims}
REFUSED_OPS = frozenset({"from_file"})  # reads a file the manifest names
_OP_NAME = re.compile(r"([a-z]+)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
SIZE_LISTS = frozenset({"size", "sizes", "shape", "repeats", "output_size"})  # a result's shape, or its factors
SIZE_SCALARS = frozenset({"n", "m", "repeats", "output_size", "steps"})  # randperm(n), eye(n, m), linspace's steps
_SYMINT = re.compile(r"SymInt(\[\d*\])?\?? (\w+)")  # a size argument in an op's schema text
_OP_PACKET = type(torch.ops.aten.add)
_OP_OVERLOAD = type(torch.ops.aten.add.Tensor)
# torch's own dtypes, layouts and memory formats, by the names the manifest writes (``float32``, ``strided``)
TORCH_OBJECTS = {
    kind: {name: v for name, v in vars(torch).items() if type(v) is cls and not name.startswith("_")}
    for kind, cls in (("dtype", torch.dtype), ("layout", torch.layout), ("memory_format", torch.memory_format))
}
_REF = re.compile(r"[A-Za-z0-9_.\-]+")  # a tensor's name in the bundle (input.0, param.w1.weight, op.3.0)
_MODULE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")  # a module path ("" is the site itself)
_SITE = re.compile(_MODULE.pattern + r"(\[[0-9]+\])?")  # a site: a module path, [N] for its N-th output view
FIX = "capture it again with `sdc incident` (a bundle is never edited by hand)"


class BundleError(SdcError):
    """The bundle cannot be used as it is."""


@dataclass(frozen=True)
class Op:
    """One recorded op: its overload (resolved through the registry), its arguments in manifest form, the module
    it ran in and the (shape, dtype) of each tensor result."""

    name: str
    func: Any
    args: list[Any]
    kwargs: dict[str, Any]
    module: str
    results: tuple[tuple[tuple[int, ...], str], ...]


@dataclass(frozen=True)
class Bundle:
    """A bundle whose every file and field was checked: what `run_once` runs."""

    path: Path
    manifest: dict[str, Any]
    ops: tuple[Op, ...]
    tensors: dict[str, torch.Tensor]
    stored: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # a stored tensor's captured (shape, stride)
    outputs: tuple[str, ...]

    @property
    def site(self) -> dict[str, Any]:
        return self.manifest["site"]


def _refuse(source: Path | str, field: str, problem: str, fix: str = FIX) -> BundleError:
    return BundleError(f"{source}: {field} {problem}; {fix}")


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """All bytes of the regular file ``path`` (symlinks followed), refused when over ``limit`` bytes, before a
    byte is read. A FIFO, a device or a directory is refused, never opened for reading (tracer/bounded_read.py)."""
    return read_bytes(path, f"bundle's {what}", limit, FIX, BundleError)


def parse_json(data: bytes, source: Path | str) -> Any:
    """JSON from an untrusted file through tracer/bounded_read.py: valid UTF-8, no duplicate key, no NaN, integers
    of at most 20 digits, strings without lone surrogates, nesting at most `MAX_DEPTH` deep (checked before it is
    parsed)."""
    return parse_bounded(data, source, JSON_BOUNDS, FIX, BundleError)


def read_safetensors(path: Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, without the safetensors package; with ``sha256``, the file's bytes must
    have that digest before any tensor is read."""
    data = read_bounded(path, TENSOR_BYTES, "tensors")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise BundleError(
            f"{path}: its SHA-256 is not the one {MANIFEST} records (files.{TENSORS}): the tensors "
            f"were changed or damaged after the capture; {FIX}"
        )
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 < n <= min(HEADER_BYTES, len(data) - 8):
        raise BundleError(f"{path}: not a safetensors file (header length {n} of a {len(data)}-byte file); {FIX}")
    header = parse_json(data[8 : 8 + n], f"{path} (header)")
    if not isinstance(header, dict):
        raise _refuse(path, "the header", "is not a JSON object")
    base, tensors = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _stored_tensor(path, name, info, data, base)
    return tensors


def _stored_tensor(path: Path, name: str, info: Any, data: bytes, base: int) -> torch.Tensor:
    field = f"tensor {name[:80]!r}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _refuse(path, field, "must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = DTYPES.get(info["dtype"]), info["shape"], info["data_offsets"]
    if dtype is None:
        raise _refuse(path, f"{field} dtype", f"{str(info['dtype'])[:20]!r} is none of {sorted(DTYPES)}")
    shape = _shape(shape, path, f"{field} shape")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= len(data) - base
    ):
        raise _refuse(path, f"{field} data_offsets", f"{str(offsets)[:60]} lie outside the file's data")
    begin, end = offsets
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise _refuse(
            path,
            field,
            f"has {end - begin} bytes where {dtype} of shape {list(shape)} takes {math.prod(shape) * dtype.itemsize}",
        )
    raw = bytearray(data[base + begin : base + end])
    flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.reshape(shape)


def _shape(value: Any, source: Path | str, field: str) -> tuple[int, ...]:
    if not (
        isinstance(value, list) and len(value) <= MAX_DIMS and all(type(d) is int and 0 <= d < 1 << 40 for d in value)
    ):
        raise _refuse(source, field, f"{str(value)[:60]} is no shape (at most {MAX_DIMS} sizes, each from 0 to 2^40)")
    if math.prod(value) > TENSOR_BYTES:
        raise _refuse(source, field, f"{value} has more elements than a bundle may hold")
    return tuple(value)


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], source: Path | str, where: str = "") -> Any:
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _refuse(source, f"{where}{key}", f"is missing or not a {names}")
    return value


def op_of(name: Any) -> Any:
    """``aten.mm.default`` -> ``torch.ops.aten.mm.default``, through torch's operator registry only: the namespace
    one of `NAMESPACES`, no part a dunder, the op registered and not one of `REFUSED_OPS`, and what resolves an
    ``OpOverload``. Nothing is called here."""
    m = _OP_NAME.fullmatch(name) if isinstance(name, str) and len(name) <= MAX_TEXT else None
    if m is None or m.group(1) not in NAMESPACES or any(p.startswith("__") for p in m.groups()):
        raise BundleError(
            f"the op name {str(name)[:80]!r} is not aten.<op>.<overload> or prims.<op>.<overload>; "
            "a bundle runs torch operators only"
        )
    namespace, packet, overload = m.groups()
    if packet in REFUSED_OPS:
        raise BundleError(f"the op {name} reads a file; a bundle never names one")
    try:
        found = getattr(NAMESPACES[namespace], packet)  # a registry lookup (torch.ops' __getattr__), or refused
        op = getattr(found, overload) if type(found) is _OP_PACKET else None
    except (AttributeError, RuntimeError):
        op = None
    if type(op) is not _OP_OVERLOAD:
        raise BundleError(f"this torch ({torch.__version__}) has no operator {name}")
    return op


def _check_arg(value: Any, known: set[str], source: str, depth: int = 0) -> None:
    """An op argument in manifest form (replay/bundle_ops.py's `encode`): every reference known, every kind
    one of ours, every name one of torch's."""
    if depth > MAX_DEPTH:
        raise BundleError(f"{source}: an argument nests more than {MAX_DEPTH} deep; {FIX}")
    if isinstance(value, list):
        for v in value:
            _check_arg(v, known, source, depth + 1)
        return
    if value is None or isinstance(value, (bool, int, float)):
        return
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise BundleError(f"{source}: a string argument of {len(value)} characters; {FIX}")
        return
    if not isinstance(value, dict) or len(value) != 1:
        raise BundleError(
            f"{source}: an argument {str(value)[:60]} is neither a value nor one {{kind: value}} pair; {FIX}"
        )
    ((kind, v),) = value.items()
    if kind == "t":
        if not isinstance(v, str) or v not in known:
            raise BundleError(
                f"{source}: reads the tensor {str(v)[:80]!r}, which neither the bundle holds nor an "
                f"earlier op made; {FIX}"
            )
    elif kind == "float":
        if v not in ("inf", "-inf", "nan"):
            raise BundleError(f"{source}: the float {str(v)[:40]!r} is none of inf, -inf, nan; {FIX}")
    elif kind in TORCH_OBJECTS:
        if not isinstance(v, str) or v not in TORCH_OBJECTS[kind]:
            raise BundleError(f"{source}: {str(v)[:40]!r} is no {kind} of torch; {FIX}")
    elif kind == "device":
        if not isinstance(v, str) or len(v) > 64:
            raise BundleError(f"{source}: a device must be a short string; {FIX}")
    elif kind == "generator":
        state = v.get("state") if isinstance(v, dict) else None
        if not isinstance(v, dict) or not set(v) <= {"device", "state"} or (state is not None and state not in known):
            raise BundleError(f"{source}: a generator must be {{device, state}} with a state the bundle holds; {FIX}")
    else:
        raise BundleError(f"{source}: unknown argument kind {str(kind)[:40]!r}; {FIX}")


def _ops(manifest: dict[str, Any], held: set[str], source: Path) -> tuple[Op, ...]:
    """The manifest's op list, each name resolved and every reference checked against what exists before it."""
    known, ops = set(held), []
    for k, entry in enumerate(_get(manifest, "ops", list, source)):
        where = f"{source}: ops[{k}]"
        if not isinstance(entry, dict):
            raise BundleError(f"{where} is not an object; {FIX}")
        name = _get(entry, "op", str, source, f"ops[{k}].")
        try:
            func = op_of(name)
        except BundleError as exc:
            raise BundleError(f"{where}: {exc}; {FIX}") from None
        args, kwargs = (
            _get(entry, "args", list, source, f"ops[{k}]."),
            _get(entry, "kwargs", dict, source, f"ops[{k}]."),
        )
        for a in [args, *kwargs.values()]:
            _check_arg(a, known, f"{where} ({name})")
        module = entry.get("module", "")
        if not isinstance(module, str) or (module and (not _MODULE.fullmatch(module) or _dunder(module))):
            raise BundleError(f"{where}.module {str(module)[:60]!r} is no module path; {FIX}")
        results = []
        for j, r in enumerate(_get(entry, "results", list, source, f"ops[{k}].")):
            if not isinstance(r, dict) or r.get("ref") != f"op.{k}.{j}" or not isinstance(r.get("dtype"), str):
                raise BundleError(f"{where}.results[{j}] must be {{ref: op.{k}.{j}, shape, dtype, ...}}; {FIX}")
            results.append((_shape(r.get("shape"), source, f"ops[{k}].results[{j}].shape"), r["dtype"]))
            known.add(r["ref"])
        ops.append(Op(name, func, args, kwargs, module, tuple(results)))
    return tuple(ops)


def _dunder(path: str) -> bool:
    return any(part.startswith("__") for part in path.split("."))


def _check_site(manifest: dict[str, Any], source: Path) -> None:
    site = _get(manifest, "site", dict, source)
    for key in ("step", "microbatch"):
        if not 0 <= _get(site, key, int, source, "site.") < 1 << 62:
            raise _refuse(source, f"site.{key}", "is negative or past 2^62")
    name, phase = _get(site, "name", str, source, "site."), _get(site, "phase", str, source, "site.")
    if not _SITE.fullmatch(name) or _dunder(name) or len(name) > MAX_TEXT:
        raise _refuse(source, "site.name", f"{name[:80]!r} is no module path")
    if phase not in ("forward", "backward"):
        raise _refuse(source, "site.phase", f"{phase[:40]!r} is neither forward nor backward")


def load(bundle: Path) -> Bundle:
    """The bundle, every file and field checked (the module docstring); `BundleError` names the first problem."""
    source = bundle / MANIFEST
    manifest = parse_json(read_bounded(source, MANIFEST_BYTES, MANIFEST), source)
    if not isinstance(manifest, dict):
        raise _refuse(source, "the manifest", "is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise BundleError(
            f"{source}: format {str(manifest.get('format'))[:60]!r}, this script reads {FORMAT}; "
            "reproduce it with the sdctrace that wrote it"
        )
    _check_site(manifest, source)
    stored: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for name, meta in _get(manifest, "tensors", dict, source).items():
        if not _REF.fullmatch(name) or len(name) > MAX_TEXT or not isinstance(meta, dict):
            raise _refuse(source, f"tensors.{name[:80]}", "is no tensor name with its shape, stride and dtype")
        shape = _shape(meta.get("shape"), source, f"tensors.{name}.shape")
        stride = meta.get("stride")
        if not (
            isinstance(stride, list)
            and len(stride) == len(shape)
            and all(type(s) is int and 0 <= s < 1 << 40 for s in stride)
        ):
            raise _refuse(source, f"tensors.{name}.stride", f"{str(stride)[:60]} is no stride of shape {list(shape)}")
        stored[name] = (shape, tuple(stride))
    ops = _ops(manifest, set(stored), source)
    made = set(stored) | {ref for k, op in enumerate(ops) for ref in (f"op.{k}.{j}" for j in range(len(op.results)))}
    outputs = _get(manifest, "outputs", list, source)
    if (
        not outputs
        or not all(isinstance(o, str) for o in outputs)
        or len(set(outputs)) != len(outputs)
        or not all(o in made for o in outputs)
    ):
        raise _refuse(source, "outputs", "must name each output once, each a tensor the bundle holds or an op made")
    digest = _check_files(bundle, _get(manifest, "files", dict, source), source)
    tensors = read_safetensors(bundle / TENSORS, digest)
    _check_tensors(tensors, stored, len(outputs), bundle / TENSORS)
    _check_rng(ops, tensors, bundle / TENSORS)
    _check_outputs(manifest, tensors, outputs, ops, source)
    _check_signatures(manifest, tensors, len(outputs), source)
    _check_sizes(ops, stored, source)
    return Bundle(bundle, manifest, ops, tensors, stored, tuple(outputs))


def _check_files(bundle: Path, files: dict[str, Any], source: Path) -> str:
    """Every file the manifest records has the SHA-256 it records (the scripts too: a bundle whose files were
    changed after the capture gets no verdict, whichever script runs it); the tensors file's digest, which
    `read_safetensors` checks as it reads."""
    known = (TENSORS, "reproduce.py", CHECKER, READER)
    for name, digest in files.items():
        if name not in known:
            raise _refuse(source, f"files.{name[:80]}", f"is none of the files a bundle holds ({', '.join(known)})")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _refuse(source, f"files.{name}", "is not a SHA-256 (64 hex digits)")
        if name != TENSORS and hashlib.sha256(read_bounded(bundle / name, MANIFEST_BYTES, name)).hexdigest() != digest:
            raise _refuse(
                bundle / name,
                f"its SHA-256 (files.{name} in {MANIFEST})",
                "is not the one recorded: the file was changed after the capture",
            )
    unrecorded = [name for name in known[1:] if name not in files and (bundle / name).exists()]
    if unrecorded:
        raise _refuse(source, f"files.{unrecorded[0]}", "is missing while the bundle holds that file")
    if TENSORS not in files:
        raise _refuse(source, f"files.{TENSORS}", "is missing or not a SHA-256")
    return files[TENSORS]


def _check_tensors(
    tensors: dict[str, torch.Tensor],
    stored: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
    outputs: int,
    source: Path,
) -> None:
    for name, (shape, stride) in stored.items():
        if name not in tensors:
            raise _refuse(source, f"tensor {name!r}", f"is missing, while {MANIFEST} names it")
        if tuple(tensors[name].shape) != shape:
            raise _refuse(
                source,
                f"tensor {name!r}",
                f"has shape {list(tensors[name].shape)} where {MANIFEST} records {list(shape)}",
            )
        extent = 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if math.prod(shape) else 0
        if extent * tensors[name].dtype.itemsize > TENSOR_BYTES:
            raise _refuse(source, f"tensor {name!r}", f"would take {extent} elements in its recorded strides")
    wanted = [f"{who}.output.{j}" for j in range(outputs) for who in ("golden", "suspect")]
    missing = [name for name in wanted if name not in tensors]
    if missing:
        raise _refuse(source, f"tensor {missing[0]!r}", "is missing")
    if "rng.cpu" in tensors and (tensors["rng.cpu"].dtype != torch.uint8 or tensors["rng.cpu"].dim() != 1):
        raise _refuse(source, "tensor 'rng.cpu'", "is no RNG state (a 1-D uint8 tensor)")


def _check_rng(ops: tuple[Op, ...], tensors: dict[str, torch.Tensor], source: Path) -> None:
    """An op that draws random numbers (dropout's ``bernoulli_``, ``rand``, ...) needs the RNG state the forward began
    with: without it every run draws anew, and a verdict would compare other draws with the captured outputs."""
    drawing = next((op.name for op in ops if torch.Tag.nondeterministic_seeded in op.func.tags), None)
    if drawing is not None and "rng.cpu" not in tensors:
        raise _refuse(source, "tensor 'rng.cpu'", f"is missing, while {drawing} draws random numbers from it")


def _check_outputs(
    manifest: dict[str, Any], tensors: dict[str, torch.Tensor], outputs: list[str], ops: tuple[Op, ...], source: Path
) -> None:
    """Each output's golden and suspect tensors have the dtype and shape `output_meta` and the op that made it
    record; an output that is a stored tensor (the site passes an input through) is golden's output bit for bit."""
    meta = _get(manifest, "output_meta", list, source)
    if len(meta) != len(outputs):
        raise _refuse(source, "output_meta", f"has {len(meta)} entries for {len(outputs)} outputs")
    for j, (ref, m) in enumerate(zip(outputs, meta)):
        shape = _shape(m.get("shape") if isinstance(m, dict) else None, source, f"output_meta[{j}].shape")
        if ref.startswith("op."):
            k, i = map(int, ref.split(".")[1:])
            made = ops[k].results[i]
        else:
            made = (tuple(tensors[ref].shape), str(tensors[ref].dtype).removeprefix("torch."))
        if made != (shape, m.get("dtype")):
            raise _refuse(
                source,
                f"outputs[{j}]",
                f"names {ref}, a {describe_results((made,))}, where output_meta records {m.get('dtype')}{list(shape)}",
            )
        for who in ("golden", "suspect"):
            t = tensors[f"{who}.output.{j}"]
            if (tuple(t.shape), str(t.dtype).removeprefix("torch.")) != made:
                raise _refuse(
                    source,
                    f"tensor {who}.output.{j}",
                    f"is {t.dtype}{list(t.shape)} where output_meta records {m.get('dtype')}{list(shape)}",
                )
        if not ref.startswith("op.") and not same_bits(tensors[ref], tensors[f"golden.output.{j}"]):
            raise _refuse(source, f"outputs[{j}]", f"names the stored tensor {ref}, which is not golden's output")


def _check_signatures(manifest: dict[str, Any], tensors: dict[str, torch.Tensor], outputs: int, source: Path) -> None:
    """The defect signatures agree with the outputs they describe: a signature for each floating output whose
    golden and suspect bits differ and for no other, each with as many differing elements, and as many flips of
    each bit, as the tensors have (outputs flipped, swapped for equal ones or made equal after the capture, even
    with the tensors' hash recorded anew, are refused here)."""
    recorded: dict[int, tuple[int, dict[str, int]]] = {}
    for i, sig in enumerate(_get(manifest, "signatures", list, source)):
        j, differing, bits = (
            (sig.get(k) for k in ("output", "differing", "bits")) if isinstance(sig, dict) else [None] * 3
        )
        if type(j) is not int or not 0 <= j < outputs or j in recorded or type(differing) is not int:
            raise _refuse(
                source, f"signatures[{i}]", f"must name one output (0..{outputs - 1}, each once) and its counts"
            )
        if not isinstance(bits, dict) or not all(type(n) is int for n in bits.values()):
            raise _refuse(source, f"signatures[{i}].bits", "is missing or not a map of bit -> elements")
        recorded[j] = (differing, bits)
    for j in range(outputs):
        g, s = tensors[f"golden.output.{j}"], tensors[f"suspect.output.{j}"]
        if not g.is_floating_point():
            continue
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[g.dtype.itemsize]
        xor = (g.contiguous().view(width) ^ s.contiguous().view(width)).reshape(-1)
        xor = xor[xor != 0]
        found = {str(b): int(((xor >> b) & 1).sum()) for b in range(8 * g.dtype.itemsize)}
        found = {b: n for b, n in found.items() if n}
        differing, bits = recorded.get(j, (0, {}))
        if (int(xor.numel()), found) != (differing, bits):
            raise _refuse(
                source,
                f"signatures (output {j})",
                f"records {differing} differing elements (bits {_shown(bits)}) where golden.output.{j} and "
                f"suspect.output.{j} differ in {xor.numel()} (bits {_shown(found)}): the outputs or the signature "
                "were changed after the capture",
            )


def _shown(bits: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{b}: {n}" for b, n in list(bits.items())[:8]) + ("..." if len(bits) > 8 else "") + "}"


def _check_sizes(ops: tuple[Op, ...], stored: dict[str, tuple[tuple[int, ...], tuple[int, ...]]], source: Path) -> None:
    """No op may ask for a tensor larger than `MAX_GROWTH` times the largest the bundle holds (at least
    `MIN_ELEMENTS`): the sizes in its arguments (an ``int[]`` or ``SymInt[]`` argument's product, a ``SymInt``,
    every number of an op that makes a range) and its recorded results, checked before any op runs."""
    largest = max([math.prod(shape) for shape, _ in stored.values()] + [1])
    cap = min(max(MIN_ELEMENTS, MAX_GROWTH * largest), TENSOR_BYTES)
    for k, op in enumerate(ops):
        asks = [math.prod(shape) for shape, _ in op.results] + _size_args(op)
        if max(asks, default=0) > cap:
            raise _refuse(
                source,
                f"ops[{k}] ({op.name})",
                f"asks for {max(asks):,} elements, more than the {cap:,} this bundle's tensors allow",
            )


def _size_args(op: Op) -> list[int]:
    """The elements ``op``'s arguments ask for: its schema's ``SymInt`` and ``SymInt[]`` arguments that size a
    result (`SIZE_LISTS`, `SIZE_SCALARS`; the Python schema objects show them as ``int``, so the schema's text is
    read), never an index such as a slice's end, and every number of a range op."""
    sizes = {name for _, name in _SYMINT.findall(str(op.func._schema))}
    arguments = op.func._schema.arguments
    given = list(zip(arguments, op.args)) + [(a, op.kwargs[a.name]) for a in arguments if a.name in op.kwargs]
    ranged = op.name.split(".")[1] in ("arange", "range")  # its ends and step size its result
    asks = []
    for arg, value in given:
        if isinstance(value, list) and arg.name in sizes and all(type(v) is int for v in value):
            magnitudes = [abs(v) for v in value]
            if arg.name in SIZE_LISTS:
                asks.append(math.prod(magnitudes))
            elif arg.name in ("stride", "pad", "padding"):
                asks.append(max(magnitudes, default=0))
        elif type(value) in (int, float) and (arg.name in SIZE_SCALARS and (arg.name in sizes or arg.name == "steps")
                                              or ranged):  # fmt: skip
            asks.append(int(abs(value)) if math.isfinite(value) else TENSOR_BYTES + 1)
    return asks


def describe_results(results: tuple[tuple[tuple[int, ...], str], ...]) -> str:
    """``float32[4, 8], int64[3]``: an op's tensor results as the manifest records them."""
    return ", ".join(f"{dtype}{list(shape)}" for shape, dtype in results) or "no tensor"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (NaNs and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous().reshape(-1), b.detach().cpu().contiguous().reshape(-1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
