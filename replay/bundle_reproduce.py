"""Re-run an incident bundle's op sequence on this machine and say whether it reproduces the suspect's bits.

This file is copied verbatim into every bundle as ``reproduce.py``, beside replay/bundle_check.py as
``bundle_check.py`` (which reads and checks the bundle), so both import only torch and the standard library::

    python INC/reproduce.py [--repeats N] [--device cpu] [--json] [--machine NAME | --no-record]

It loads the site's inputs, parameters and constants (``tensors.safetensors``) and the aten op sequence
(``manifest.json``), runs the sequence ``--repeats`` times from the captured RNG state, and compares each
run's outputs bit for bit with the golden and the suspect outputs the bundle holds. One verdict, one exit code:

    0  transient         every run reproduces the golden bits: the fault does not repeat here
    4  persistent here   every run reproduces the suspect's bits: this machine repeats the corruption
    5  nondeterministic  the runs' bits differ among themselves: the stack is not deterministic here
    6  unexplained       the runs agree but match neither the golden nor the suspect output
    2  the bundle or the arguments are unusable (a message says why)

The bundle is checked before anything in it is used (replay/bundle_check.py, which a bundle carries beside this
script): nothing in it is imported, loaded or called but torch operators, and a bundle that fails a check is
refused (exit 2) with one line naming the file, the field and the fix, never given a verdict. This script is the
bundle's own code, which a bundle from elsewhere may have changed: reproduce such a bundle with the installed
``sdc incident reproduce BUNDLE``, which imports sdctrace's copy of this module and never the bundle's script.

Each verdict is appended to the bundle's own ``verdicts.jsonl`` (one JSON line: the machine, by default its host
name, the verdict, the runs, torch and the device; `record_verdict`), so the bundle carries every reproduction
run so far wherever it travels and `sdc incident load` puts them beside its signature. Nothing is written outside
the bundle's folder; a read-only bundle is reported and the verdict stands (``--no-record`` skips the line).

*software* is what two machines' verdicts say together: a bundle that is *persistent here* on a healthy machine
too reproduces the suspect's bits without the suspect's hardware (docs/incident.md). sdctrace imports this
module for ``sdc incident reproduce``, which runs `reproduce` under the fault emulator (``within`` puts each op in
its module).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING or __package__:  # sdctrace's replay.bundle_reproduce (the checker reads this branch)
    from replay.bundle_check import (
        FIX,
        MANIFEST,
        TORCH_OBJECTS,
        VERDICTS_FILE,
        Bundle,
        BundleError,
        describe_results,
        load,
        same_bits,
    )
else:  # a bundle's reproduce.py: the checker the bundle carries beside it (`python -I` puts no folder on the path)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bundle_check import (
        FIX,
        MANIFEST,
        TORCH_OBJECTS,
        VERDICTS_FILE,
        Bundle,
        BundleError,
        describe_results,
        load,
        same_bits,
    )

# 1 and 3 are sdc's own (an error, the guard's stop), so a verdict never reads as one
Within = Callable[[str, Callable[[], Any]], Any]  # (module path below the site, an op's call) -> its result
VERDICTS = {"transient": 0, "persistent here": 4, "nondeterministic": 5, "unexplained": 6}
USAGE_ERROR = 2


def device_of(text: str) -> torch.device:
    """A device to run on, refused in one line unless torch can put a tensor there."""
    try:
        where = torch.device(text)
        if where.type == "meta":
            raise RuntimeError("a meta tensor holds no bits to compare")
        torch.empty(1, device=where)
    except (RuntimeError, AssertionError, ValueError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BundleError(
            f"device {text[:40]!r} is not usable here ({reason}); pass --device cpu or one this machine has"
        ) from None
    return where


def decode(value: Any, env: dict[str, torch.Tensor], device: torch.device) -> Any:
    """An op argument from its manifest form (see replay/bundle_ops.py's `encode`), checked by `load`."""
    if isinstance(value, list):
        return [decode(v, env, device) for v in value]
    if not isinstance(value, dict):
        return value
    ((kind, v),) = value.items()
    if kind == "t":
        return env[v]
    if kind == "float":
        return float(v)
    if kind in TORCH_OBJECTS:
        return TORCH_OBJECTS[kind][v]
    if kind == "device":
        return device
    # the model's own generator: its captured state, or a fresh seed where it has none
    g = torch.Generator(device=device)
    if "state" in v:
        g.set_state(env[v["state"]].cpu())
    else:
        g.seed()
    return g


def flatten(out: Any) -> list[Any]:
    """An op's results (or a module's arguments) in order: nested tuples, lists and dict values flattened."""
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in flatten(o)]
    if isinstance(out, dict):
        return [x for o in out.values() for x in flatten(o)]
    return [out]


def inputs(bundle: Bundle, device: torch.device) -> dict[str, torch.Tensor]:
    """Fresh copies of the site's inputs, parameters and constants, in their captured strides."""
    env = {}
    for name, (shape, stride) in bundle.stored.items():
        saved = bundle.tensors[name]
        t = torch.empty_strided(shape, stride, dtype=saved.dtype, device=device)
        env[name] = t.copy_(saved.to(device))
    return env


def run_once(bundle: Bundle, device: torch.device, within: Within | None = None) -> list[torch.Tensor]:
    """Run the op sequence once from the captured RNG state; the site's outputs. ``within(module, op)`` runs each
    op inside the module it ran in (a path below the site, "" for the site itself): sdctrace's emulated
    reproduction does, so that a fault rule naming module paths finds them."""
    env = inputs(bundle, device)
    if "rng.cpu" in bundle.tensors:
        torch.set_rng_state(bundle.tensors["rng.cpu"])
    with torch.no_grad():
        for k, op in enumerate(bundle.ops):
            try:
                args = decode(op.args, env, device)
                kwargs = {key: decode(v, env, device) for key, v in op.kwargs.items()}
                call = functools.partial(op.func, *args, **kwargs)
                out = call() if within is None else within(op.module, call)
            except (RuntimeError, TypeError, ValueError, IndexError) as exc:
                reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                raise BundleError(
                    f"{bundle.path / MANIFEST}: ops[{k}] ({op.name}) fails on its recorded arguments ({reason}); {FIX}"
                ) from None
            results = [t for t in flatten(out) if isinstance(t, torch.Tensor)]
            got = tuple((tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in results)
            if got != op.results:
                raise BundleError(
                    f"{bundle.path / MANIFEST}: ops[{k}] ({op.name}) made {describe_results(got)} where the "
                    f"manifest records {describe_results(op.results)}; {FIX}"
                )
            for j, t in enumerate(results):
                env[f"op.{k}.{j}"] = t
    return [env[ref].detach().clone() for ref in bundle.outputs]


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


def reproduce(
    bundle: Path,
    repeats: int = 5,
    device: str | None = None,
    runs_within: Callable[[int], tuple[AbstractContextManager[Any], Within]] | None = None,
    loaded: Bundle | None = None,
) -> dict[str, Any]:
    """Run ``bundle``'s op sequence ``repeats`` times; the verdict and what it rests on. ``runs_within(i)`` gives
    the context run ``i`` runs in and its `run_once` ``within``; ``loaded`` is the bundle when already `load`-ed."""
    if not 1 <= repeats <= 10_000:
        raise BundleError(f"--repeats {repeats}: give 1 to 10000 (2 or more to see nondeterminism)")
    b = loaded or load(bundle)
    recorded = b.manifest.get("device", "cpu")
    where = device_of(device or (recorded if isinstance(recorded, str) else "cpu"))
    outputs = range(len(b.outputs))
    golden = [b.tensors[f"golden.output.{j}"] for j in outputs]
    suspect = [b.tensors[f"suspect.output.{j}"] for j in outputs]
    runs = []
    for i in range(repeats):
        context, within = runs_within(i) if runs_within is not None else (nullcontext(), None)
        with context:
            runs.append(run_once(b, where, within))
    verdict = classify(runs, golden, suspect)
    differing = [sum(not same_bits(r[j], runs[0][j]) for r in runs) for j in outputs]
    return {
        "verdict": verdict,
        "exit_code": VERDICTS[verdict],
        "repeats": repeats,
        "device": str(where),
        "torch": torch.__version__,
        "site": b.site,
        "golden_equals_suspect": all_same(golden, suspect),
        "runs_differing_from_the_first": differing,
        "runs_matching_golden": sum(all_same(r, golden) for r in runs),
        "runs_matching_suspect": sum(all_same(r, suspect) for r in runs),
    }


def record_verdict(bundle: Path, result: dict[str, Any], machine: str | None = None) -> Path:
    """Append ``result``'s verdict to ``bundle/verdicts.jsonl`` (never a file a link points to elsewhere); the file.
    ``machine`` names where it ran (default: this host's name)."""
    line = {
        "machine": machine or socket.gethostname(),
        "verdict": result["verdict"],
        "repeats": result["repeats"],
        "runs_matching_golden": result["runs_matching_golden"],
        "runs_matching_suspect": result["runs_matching_suspect"],
        "device": result["device"],
        "torch": result["torch"],
        "emulated": (result.get("emulated") or {}).get("profile"),
        "unix": time.time(),
    }
    path = bundle / VERDICTS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
    return path


def describe(result: dict[str, Any]) -> str:
    site = result["site"]
    where = f"step {site['step']}, microbatch {site['microbatch']}, {site['phase']} {site['name']}"
    lines = [
        f"{where}: {result['verdict']} (exit {result['exit_code']})",
        f"  {result['repeats']} runs on {result['device']} with torch {result['torch']}: "
        f"{result['runs_matching_golden']} reproduce the golden bits, "
        f"{result['runs_matching_suspect']} the suspect's",
    ]
    if result["golden_equals_suspect"]:
        lines.append("  note: the bundle's golden and suspect outputs are equal; no fault was captured")
    return "\n".join(lines)


def main(argv: list[str] | None = None, bundle: Path | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="identical runs of the op sequence (default 5)")
    parser.add_argument("--device", default=None, help="where to run (default: the device the bundle was captured on)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--machine", default=None, help="the name verdicts.jsonl gives this machine (default: its host name)"
    )
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
