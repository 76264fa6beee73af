"""Re-run an incident bundle's op sequence on this machine and say whether it reproduces the suspect's bits.

This file is copied verbatim into every bundle as ``reproduce.py``, so it imports only torch and the standard
library (its safetensors reader is the few lines below)::

    python INC/reproduce.py [--repeats N] [--device cpu] [--json] [--machine NAME | --no-record]

It loads the site's inputs, parameters and constants (``tensors.safetensors``) and the aten op sequence
(``manifest.json``), runs the sequence ``--repeats`` times from the captured RNG state, and compares each
run's outputs bit for bit with the golden and the suspect outputs the bundle holds. One verdict, one exit code:

    0  transient         every run reproduces the golden bits: the fault does not repeat here
    4  persistent here   every run reproduces the suspect's bits: this machine repeats the corruption
    5  nondeterministic  the runs' bits differ among themselves: the stack is not deterministic here
    6  unexplained       the runs agree but match neither the golden nor the suspect output
    2  the bundle or the arguments are unusable (a message says why)

Each verdict is appended to the bundle's own ``verdicts.jsonl`` (one JSON line: the machine, by default its host
name, the verdict, the runs, torch and the device; `record_verdict`), so the bundle carries every reproduction
run so far wherever it travels and `sdc incident load` puts them beside its signature. Nothing is written outside
the bundle's folder; a read-only bundle is reported and the verdict stands (``--no-record`` skips the line).

*software* is what two machines' verdicts say together: a bundle that is *persistent here* on a healthy machine
too reproduces the suspect's bits without the suspect's hardware (docs/incident.md). sdctrace imports this
module for ``sdc incident reproduce``, which runs `reproduce` under the fault emulator (``within`` puts each op in its module).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

# 1 and 3 are sdc's own (an error, the guard's stop), so a verdict never reads as one
Within = Callable[[str, Callable[[], Any]], Any]  # (module path below the site, an op's call) -> its result
VERDICTS = {"transient": 0, "persistent here": 4, "nondeterministic": 5, "unexplained": 6}
USAGE_ERROR = 2
MANIFEST, TENSORS, VERDICTS_FILE = "manifest.json", "tensors.safetensors", "verdicts.jsonl"
FORMAT = "sdctrace-incident/1"
# safetensors' dtype codes (little-endian data)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


class BundleError(Exception):
    """The bundle cannot be used as it is."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, without the safetensors package."""
    data = path.read_bytes()
    if len(data) < 8:
        raise BundleError(f"{path}: too short for a safetensors file")
    n = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as exc:
        raise BundleError(f"{path}: its header is not JSON ({exc})") from None
    base, tensors = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = DTYPES.get(info["dtype"])
        if dtype is None or not 0 <= begin <= end <= len(data) - base:
            raise BundleError(f"{path}: tensor {name!r} has an unknown dtype or lies outside the file")
        raw = bytearray(data[base + begin:base + end])
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return tensors


def load(bundle: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The bundle's manifest and tensors."""
    try:
        manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{bundle}: no readable {MANIFEST} ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{bundle}: {MANIFEST} is {manifest.get('format')!r}, this script reads {FORMAT}")
    return manifest, read_safetensors(bundle / TENSORS)


def op_of(name: str) -> Any:
    """``aten.mm.default`` -> ``torch.ops.aten.mm.default``."""
    namespace, packet, overload = name.split(".", 2)
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except AttributeError:
        raise BundleError(f"this torch ({torch.__version__}) has no op {name}") from None


def decode(value: Any, env: dict[str, torch.Tensor], device: torch.device) -> Any:
    """An op argument from its manifest form (see replay/bundle_ops.py's `encode`)."""
    if isinstance(value, list):
        return [decode(v, env, device) for v in value]
    if not isinstance(value, dict):
        return value
    (kind, v), = value.items()
    if kind == "t":
        return env[v]
    if kind == "float":
        return float(v)
    if kind == "dtype":
        return getattr(torch, v)
    if kind == "device":
        return device
    if kind == "layout":
        return getattr(torch, v)
    if kind == "memory_format":
        return getattr(torch, v)
    if kind == "generator":  # the model's own generator: its captured state, or a fresh seed where it has none
        g = torch.Generator(device=device)
        if "state" in v:
            g.set_state(env[v["state"]].cpu())
        else:
            g.seed()
        return g
    raise BundleError(f"unknown argument kind {kind!r}")


def flatten(out: Any) -> list[Any]:
    """An op's results (or a module's arguments) in order: nested tuples, lists and dict values flattened."""
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in flatten(o)]
    if isinstance(out, dict):
        return [x for o in out.values() for x in flatten(o)]
    return [out]


def inputs(manifest: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Fresh copies of the site's inputs, parameters and constants, in their captured strides."""
    env = {}
    for name, meta in manifest["tensors"].items():
        saved = tensors[name]
        t = torch.empty_strided(meta["shape"], meta["stride"], dtype=saved.dtype, device=device)
        env[name] = t.copy_(saved.to(device))
    return env


def run_once(manifest: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device,
             within: Within | None = None) -> list[torch.Tensor]:
    """Run the op sequence once from the captured RNG state; the site's outputs. ``within(module, op)`` runs each
    op inside the module it ran in (a path below the site, "" for the site itself): sdctrace's emulated
    reproduction does, so that a fault rule naming module paths finds them."""
    env = inputs(manifest, tensors, device)
    if "rng.cpu" in tensors:
        torch.set_rng_state(tensors["rng.cpu"])
    with torch.no_grad():
        for k, op in enumerate(manifest["ops"]):
            args = decode(op["args"], env, device)
            kwargs = {key: decode(v, env, device) for key, v in op["kwargs"].items()}
            func = op_of(op["op"])
            if within is None:
                out = func(*args, **kwargs)
            else:
                out = within(op.get("module", ""), lambda: func(*args, **kwargs))
            for j, t in enumerate(flatten(out)):
                if isinstance(t, torch.Tensor):
                    env[f"op.{k}.{j}"] = t
    return [env[ref].detach().clone() for ref in manifest["outputs"]]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (NaNs and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous().reshape(-1), b.detach().cpu().contiguous().reshape(-1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def all_same(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> bool:
    return len(xs) == len(ys) and all(same_bits(x, y) for x, y in zip(xs, ys))


def classify(runs: list[list[torch.Tensor]], golden: list[torch.Tensor], suspect: list[torch.Tensor]) -> str:
    """The verdict for ``runs`` (each the outputs of one run). Where the bundle's golden and suspect outputs are
    equal (no fault was captured), runs that give them are transient: nothing here repeats a fault."""
    if any(not all_same(r, runs[0]) for r in runs[1:]):
        return "nondeterministic"
    if all_same(runs[0], suspect) and not all_same(golden, suspect):
        return "persistent here"
    if all_same(runs[0], golden):
        return "transient"
    return "unexplained"


def reproduce(bundle: Path, repeats: int = 5, device: str | None = None,
              runs_within: Callable[[int], tuple[AbstractContextManager[Any], Within]] | None = None
              ) -> dict[str, Any]:
    """Run ``bundle``'s op sequence ``repeats`` times; the verdict and what it rests on. ``runs_within(i)`` gives
    the context run ``i`` runs in and its `run_once` ``within``."""
    if repeats < 1:
        raise BundleError(f"--repeats {repeats}: give at least 1 (2 or more to see nondeterminism)")
    manifest, tensors = load(bundle)
    where = torch.device(device or manifest.get("device", "cpu"))
    outputs = range(len(manifest["outputs"]))
    golden = [tensors[f"golden.output.{j}"] for j in outputs]
    suspect = [tensors[f"suspect.output.{j}"] for j in outputs]
    runs = []
    for i in range(repeats):
        context, within = runs_within(i) if runs_within is not None else (nullcontext(), None)
        with context:
            runs.append(run_once(manifest, tensors, where, within))
    verdict = classify(runs, golden, suspect)
    differing = [sum(not same_bits(r[j], runs[0][j]) for r in runs) for j in outputs]
    return {"verdict": verdict, "exit_code": VERDICTS[verdict], "repeats": repeats, "device": str(where),
            "torch": torch.__version__, "site": manifest["site"], "golden_equals_suspect": all_same(golden, suspect),
            "runs_differing_from_the_first": differing,
            "runs_matching_golden": sum(all_same(r, golden) for r in runs),
            "runs_matching_suspect": sum(all_same(r, suspect) for r in runs)}


def record_verdict(bundle: Path, result: dict[str, Any], machine: str | None = None) -> Path:
    """Append ``result``'s verdict to ``bundle/verdicts.jsonl`` (never a file a link points to elsewhere); the file.
    ``machine`` names where it ran (default: this host's name)."""
    line = {"machine": machine or socket.gethostname(), "verdict": result["verdict"], "repeats": result["repeats"],
            "runs_matching_golden": result["runs_matching_golden"],
            "runs_matching_suspect": result["runs_matching_suspect"], "device": result["device"],
            "torch": result["torch"], "emulated": (result.get("emulated") or {}).get("profile"), "unix": time.time()}
    path = bundle / VERDICTS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
    return path


def describe(result: dict[str, Any]) -> str:
    site = result["site"]
    where = f"step {site['step']}, microbatch {site['microbatch']}, {site['phase']} {site['name']}"
    lines = [f"{where}: {result['verdict']} (exit {result['exit_code']})",
             f"  {result['repeats']} runs on {result['device']} with torch {result['torch']}: "
             f"{result['runs_matching_golden']} reproduce the golden bits, "
             f"{result['runs_matching_suspect']} the suspect's"]
    if result["golden_equals_suspect"]:
        lines.append("  note: the bundle's golden and suspect outputs are equal; no fault was captured")
    return "\n".join(lines)


def main(argv: list[str] | None = None, bundle: Path | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="identical runs of the op sequence (default 5)")
    parser.add_argument("--device", default=None, help="where to run (default: the device the bundle was captured on)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--machine", default=None, help="the name verdicts.jsonl gives this machine (default: its "
                        "host name)")
    parser.add_argument("--no-record", action="store_true", help="do not append the verdict to verdicts.jsonl")
    args = parser.parse_args(argv)
    where = bundle or Path(__file__).resolve().parent
    try:
        result = reproduce(where, args.repeats, args.device)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(json.dumps(result) if args.json else describe(result))
    if not args.no_record:
        try:
            record_verdict(where, result, args.machine)
        except OSError as exc:
            print(f"note: the verdict was not added to {where / VERDICTS_FILE} ({exc})", file=sys.stderr)
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
