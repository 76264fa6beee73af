"""Crafted inputs from elsewhere, each run through its command, each outcome classified. Counts, not a test.

    .venv/bin/python tools/fuzz_inputs.py --cases 500 --seed 0

Kinds: incident bundles (``sdc incident reproduce``: manifests changed field by field and as text, tensors
flipped with and without their hash recorded anew, files swapped for FIFOs, devices and folders, hostile op names,
ops asking for huge tensors, scripts changed), bundles for ``sdc incident load`` (manifests and verdict lines, into
a database that already holds rows), tolerance maps (``sdc diff --tolerance``), fault profiles
(``sdc faults show``), study files (``sdc study``) and study databases (``sdc query``, ``sdc query --sql``,
``sdc report``, ``sdc certify --db``, ``sdc diff --db``, ``sdc incident load --db``: tools/fuzz_db.py). Every case
but a database that is still sdctrace's is built to be refused. Each runs in this process through
``sdc.cli.main`` under a watchdog and ends as one of the outcomes of tools/fuzz_case.py (ok, one-line error,
multi-line error, traceback, hang, silently accepted, data changed, code ran); the last five are bad.

Python's random (seeded) generates the cases; where a field has a rule of its own (verdict lines, tolerance-map
places) Hypothesis draws values just outside it too (tools/fuzz_props.py; the ``[test]`` extra installs it, and
without it those cases come from the seeded pools as well). The same seed gives the same cases.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from sdc.cli import main as sdc_main  # noqa: E402
from tests.replay.bundle_craft import small_bundle, swap_for  # noqa: E402
from tools import fuzz_props  # noqa: E402
from tools.fuzz_case import BAD, OUTCOMES, Case, run_case  # noqa: E402
from tools.fuzz_db import db_cases  # noqa: E402

# -- values a crafted file holds ---------------------------------------------------------------------------------
RAW_TEXT: list[Callable[[str], str]] = [
    lambda t: t[: len(t) // 2],
    lambda t: "[" * 100_000 + "]" * 100_000,
    lambda t: t.replace("{", '{"format": 1, ', 1),  # a duplicate key
    lambda t: t.replace("{", '{"zz": ' + "9" * 5000 + ", ", 1),
    lambda t: t.replace("{", '{"zz": 1e400, ', 1),
    lambda t: t.replace("{", '{"zz": NaN, ', 1),
    lambda t: t.replace("{", '{"zz": "\\udc00", ', 1),
    lambda t: "[" + t + "]",
    lambda t: "7",
    lambda t: "\xff" + t,
]
OP_NAMES = [
    "load_library.__self__.load_library",
    "aten.__self__.load_library",
    "prims.__self__.load_library",
    "aten.__class__.__init__",
    "aten.add.__call__",
    "aten.from_file.default",
    "torch.load.x",
    "aten.mm",
    "builtins.exec.x",
    "aten.nosuch.default",
]
SIZES = [
    ("aten.empty.memory_format", [[1 << 16, 1 << 15]]),
    ("aten.randperm.default", [1 << 31]),
    ("aten.new_empty.default", [{"t": "input.0"}, [1 << 31]]),
    ("aten.arange.default", [float(1 << 31)]),
]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            found += _paths(v, (*prefix, i))
    return found


# Fields a file may leave out or set to null, and values where any value of the type fits (an op's arguments):
# a crafted change there is no damage, so none is made.
OPTIONAL = frozenset({"run_id", "node_label", "period", "offset", "op", "emulated", "module", "max_ulps"})


def _hostile_for(original: Any, path: tuple, rng: random.Random) -> Any:
    """A value that no reader may take where ``original`` was: another type, or one past the field's bounds."""
    in_args = "args" in path or "kwargs" in path
    if isinstance(original, bool):
        pool: list[Any] = ["x", 1 << 70, []]
    elif isinstance(original, int):
        pool = ["1", 3.5, [], 1 << 70] if in_args else [-1, 1 << 63, 1 << 70, "1", 3.5, True, []]
    elif isinstance(original, float):
        pool = ["x", [], -1.0]
    elif isinstance(original, str):
        pool = [1 << 70, "\ud800", "x" * 5000, [], {}, True]
    elif isinstance(original, list):
        pool = ["x", 5, {}] + ([] if in_args else [[[[[[]]]]]])
    elif isinstance(original, dict):
        pool = ["x", 5, [], {"t": "nosuch"}] if in_args else ["x", 5, []]
    else:
        pool = [] if in_args else [{"t": "nosuch"}, "\ud800", [[]]]
    if not in_args and path[-1] not in OPTIONAL and original is not None:
        pool.append(None)
    return rng.choice(pool or ["\ud800"])


def _set(doc: Any, path: tuple, rng: random.Random) -> str:
    """Damage the field at ``path`` of ``doc``; what was done."""
    *parents, last = path
    for p in parents:
        doc = doc[p]
    removable = isinstance(doc, dict) and last not in OPTIONAL and "args" not in path and "kwargs" not in path
    if removable and rng.random() < 0.2:
        del doc[last]
        return f"{'.'.join(map(str, path))} removed"
    doc[last] = _hostile_for(doc[last], path, rng)
    return f"{'.'.join(map(str, path))} = {str(doc[last])[:20]!r}"


def _edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc, ensure_ascii=True), encoding="utf-8")


def _rehash(bundle: Path) -> None:
    digest = hashlib.sha256((bundle / "tensors.safetensors").read_bytes()).hexdigest()
    _edit_json(bundle / "manifest.json", lambda m: m["files"].update({"tensors.safetensors": digest}))


def _read_by_load(path: tuple) -> bool:
    """Whether replay/bundle_check.py's `load` reads the field at ``path`` (a change elsewhere is no damage)."""
    if path[0] == "signatures":
        return len(path) < 3 or path[2] in ("output", "differing", "bits")
    if path[0] == "ops" and len(path) > 2 and path[2] == "results":
        return len(path) < 5 or path[4] in ("ref", "shape", "dtype")
    if path[0] == "tensors":
        return len(path) < 3 or path[2] in ("shape", "stride")
    if path[0] == "output_meta":
        return len(path) < 3 or path[2] in ("shape", "dtype")
    if path[0] == "ops" and len(path) > 2:
        return path[2] in ("op", "args", "kwargs", "module", "results")
    return path[0] in ("format", "site", "ops", "outputs", "files")


def _bundle_change(bundle: Path, rng: random.Random, marker: Path) -> str:
    """Damage ``bundle`` one way; its name."""
    manifest, tensors = bundle / "manifest.json", bundle / "tensors.safetensors"
    doc = json.loads(manifest.read_text(encoding="utf-8"))
    roll = rng.random()
    if roll < 0.35:
        path = rng.choice([p for p in _paths(doc) if _read_by_load(p)])
        done = _set(doc, path, rng)
        manifest.write_text(json.dumps(doc, ensure_ascii=True), encoding="utf-8")
        return f"field {done}"
    if roll < 0.5:
        change = rng.choice(RAW_TEXT)
        text = change(manifest.read_text(encoding="utf-8"))
        manifest.write_bytes(text.encode("utf-8", "surrogatepass"))
        return "manifest text"
    if roll < 0.65:
        data = bytearray(tensors.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        tensors.write_bytes(bytes(data))
        return "tensor byte flipped"
    if roll < 0.72:
        data = bytearray(tensors.read_bytes())
        data[len(data) - rng.randrange(1, 257)] ^= 1 << rng.randrange(8)  # golden or suspect output
        tensors.write_bytes(bytes(data))
        _rehash(bundle)
        return "output byte flipped, hash recorded anew"
    if roll < 0.8:
        name = rng.choice(["tensors.safetensors", "manifest.json", "reproduce.py"])
        how = rng.choice(["fifo", "directory", "dev-zero", "missing"])
        swap_for(bundle / name, how)
        return f"{name} -> {how}"
    if roll < 0.9:
        name = rng.choice(OP_NAMES)
        _edit_json(manifest, lambda m: m["ops"][0].update(op=name, args=[str(marker)], kwargs={}))
        return f"op {name}"
    if roll < 0.95:
        op, args = rng.choice(SIZES)

        def append(m: dict) -> None:
            k = len(m["ops"])
            result = {"ref": f"op.{k}.0", "shape": [1], "stride": [1], "dtype": "float32"}
            m["ops"].append({"op": op, "args": args, "kwargs": {}, "module": "", "results": [result]})

        _edit_json(manifest, append)
        return f"huge {op}"
    with open(bundle / rng.choice(["reproduce.py", "bundle_check.py", "bounded_read.py"]), "a") as f:
        f.write("\nprint('changed')\n")
    return "script changed"


def bundle_cases(root: Path, n: int, rng: random.Random) -> list[Case]:
    base = small_bundle(root / "base-bundle")
    cases = []
    for i in range(n):
        folder = root / f"bundle-{i}"
        shutil.copytree(base, folder, symlinks=True)
        marker = root / f"marker-{i}"
        name = _bundle_change(folder, rng, marker)
        argv = ("incident", "reproduce", str(folder), "--no-record", "--repeats", "1")
        cases.append(Case("bundle", name, argv, str(folder), marker=str(marker)))
    return cases


LOAD_MANIFEST = {
    "format": "sdctrace-incident/1",
    "site": {"step": 3, "microbatch": 0, "name": "layers.1", "phase": "forward"},
    "golden": {"run_id": "g-1", "node_label": "golden"},
    "suspect": {"node_label": "node-7", "run_id": "s-1"},
    "signatures": [
        {
            "output": 0,
            "dtype": "float32",
            "shape": [2, 4],
            "shape_class": "2x4",
            "elements": 8,
            "differing": 1,
            "fields": {"sign": 0, "exponent": 1, "mantissa": 0},
            "bits": {"27": 1},
            "ulps_max": 1.0,
            "ulps_median": 1.0,
            "period": None,
            "offset": None,
            "op": "aten.mm.default",
        }
    ],
}
VERDICT = {"machine": "h", "verdict": "transient", "emulated": None, "repeats": 1, "device": "cpu", "torch": "2"}


def good_load_bundle(root: Path) -> Path:
    """A bundle `sdc incident load` takes (its manifest only), made once in ``root``."""
    good = root / "load-good"
    if not good.is_dir():
        good.mkdir()
        (good / "manifest.json").write_text(json.dumps(LOAD_MANIFEST))
    return good


def _drawn(strategy: Callable[[], Any], n: int, rng: random.Random) -> Iterator[tuple[str, dict[str, Any]]]:
    """Hypothesis's draws of ``strategy`` (tools/fuzz_props.py), seeded from ``rng``, marked as Hypothesis's; none
    without Hypothesis (the caller's own pool then). ``rng`` moves the same either way."""
    seed = rng.randrange(1 << 32)
    if not fuzz_props.available():
        return iter(())
    return ((f"{what} (hypothesis)", doc) for what, doc in fuzz_props.draws(strategy(), n, seed))


def load_cases(root: Path, n: int, rng: random.Random) -> list[Case]:
    """`sdc incident load` of a crafted bundle into a copy of a database that already holds a good one's rows."""
    good = good_load_bundle(root)
    db = root / "load-base.duckdb"
    with redirect_stdout(io.StringIO()):
        assert sdc_main(["incident", "load", str(good), "--db", str(db)]) == 0
    drawn = _drawn(fuzz_props.verdict_lines, n, rng)
    cases = []
    for i in range(n):
        folder = root / f"load-{i}"
        folder.mkdir()
        doc = json.loads(json.dumps(LOAD_MANIFEST))
        if rng.random() < 0.7:
            done = _set(doc, rng.choice(_paths(doc)), rng)
            text, name, target = json.dumps(doc, ensure_ascii=True), f"field {done}", "manifest"
        else:
            text, target = json.dumps(doc), "verdicts"
            what, line = next(drawn, (None, dict(VERDICT, unix=1.0)))
            name = f"verdict line {what or _set(line, (rng.choice(list(line)),), rng)}"
            (folder / "verdicts.jsonl").write_text(json.dumps(line, ensure_ascii=True) + "\n")
        if rng.random() < 0.2:
            text = rng.choice(RAW_TEXT)(text)
            name += " + text"
            target = "manifest"
        (folder / "manifest.json").write_bytes(text.encode("utf-8", "surrogatepass"))
        copy = root / f"load-{i}.duckdb"
        shutil.copy(db, copy)
        crafted = folder / ("verdicts.jsonl" if target == "verdicts" else "manifest.json")
        cases.append(Case("load", name, ("incident", "load", str(folder), "--db", str(copy)), str(crafted), str(copy)))
    return cases


MAP = {
    "format": "sdctrace-tolerance-map",
    "version": 1,
    "margin": 2.0,
    "measured": {"runs": ["a", "b"], "steps": [0], "ranks": [0]},
    "places": [dict(fuzz_props.PLACE)],
}


def map_cases(root: Path, n: int, rng: random.Random) -> list[Case]:
    drawn = _drawn(fuzz_props.map_places, n, rng)
    cases = []
    for i in range(n):
        path = root / f"map-{i}.json"
        doc = json.loads(json.dumps(MAP))
        roll = rng.random()
        if roll < 0.3 and (place := next(drawn, None)):
            doc["places"][0] = place[1]
            name = f"place {place[0]}"
            path.write_bytes(json.dumps(doc, ensure_ascii=True).encode())
        elif roll < 0.6:
            name = f"field {_set(doc, rng.choice(_paths(doc)), rng)}"
            path.write_bytes(json.dumps(doc, ensure_ascii=True).encode())
        elif roll < 0.9:
            path.write_bytes(rng.choice(RAW_TEXT)(json.dumps(doc)).encode("utf-8", "surrogatepass"))
            name = "map text"
        else:
            path.write_text("{}")
            how = rng.choice(["fifo", "directory", "dev-zero"])
            swap_for(path, how)
            name = f"map -> {how}"
        argv = (
            "diff",
            "--golden",
            "G",
            "--suspect",
            "S",
            "--db",
            str(root / f"map-{i}.duckdb"),
            "--tolerance",
            str(path),
        )
        cases.append(Case("tolerance", name, argv, str(path)))
    return cases


PROFILE_TEXT: list[Callable[[str], str]] = [
    lambda t: t + "\nname = 'again'\n",
    lambda t: t + "\nzz = " + "[" * 5000 + "]" * 5000 + "\n",
    lambda t: t + "\nzz = " + "9" * 5000 + "\n",
    lambda t: t + '\nzz = "' + "x" * 100_000 + '"\n',
    lambda t: t + '\nzz = "\\ud800"\n',
    lambda t: "\xff" + t,
    lambda t: t[: len(t) // 2] + "[",
]


def toml_cases(root: Path, n: int, rng: random.Random, kind: str) -> list[Case]:
    """Fault profiles (``sdc faults show``) or study files (``sdc study``), damaged as text or swapped for a FIFO,
    a folder or a device."""
    shipped = {"profile": "faults/profiles/bursty-mismatch.toml", "study": "sdc/study/studies/demo.toml"}[kind]
    base = (Path(__file__).resolve().parents[1] / shipped).read_text()
    cases = []
    for i in range(n):
        path = root / f"{kind}-{i}.toml"
        if rng.random() < 0.8:
            path.write_bytes(rng.choice(PROFILE_TEXT)(base).encode("utf-8", "surrogatepass"))
            name = f"{kind} text"
        else:
            path.write_text(base)
            how = rng.choice(["fifo", "directory", "dev-zero"])
            swap_for(path, how)
            name = f"{kind} -> {how}"
        out = str(root / f"out-{i}")
        argv = ("faults", "show", str(path)) if kind == "profile" else ("study", str(path), "--out", out)
        cases.append(Case(kind, name, argv, str(path)))
    return cases


def campaign(root: Path, cases: int, seed: int, verbose: bool = False) -> Counter[tuple[str, str]]:
    """Generate about ``cases`` cases in ``root`` and run them; counts by (kind, outcome)."""
    rng = random.Random(seed)
    share = {"bundle": 0.34, "load": 0.16, "tolerance": 0.16, "profile": 0.08, "study": 0.08, "database": 0.18}
    made: dict[str, Callable[[Path, int, random.Random], list[Case]]] = {
        "bundle": bundle_cases,
        "load": load_cases,
        "tolerance": map_cases,
        "profile": lambda root, n, rng: toml_cases(root, n, rng, "profile"),
        "study": lambda root, n, rng: toml_cases(root, n, rng, "study"),
        "database": lambda root, n, rng: db_cases(root, n, rng, good_load_bundle(root)),
    }
    counts: Counter[tuple[str, str]] = Counter()
    for kind, build in made.items():
        for case in build(root, max(1, round(cases * share[kind])), rng):
            outcome, last = run_case(case)
            counts[(kind, outcome)] += 1
            if verbose or outcome in BAD:
                print(f"{outcome:<18} {kind:<10} {case.name[:50]:<50} {last[:140]}")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=500, help="about this many crafted inputs (default 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print every case, not only the bad ones")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sdc-fuzz-") as tmp:
        counts = campaign(Path(tmp), args.cases, args.seed, args.verbose)
    kinds = sorted({k for k, _ in counts})
    print(f"{'outcome':<18} " + " ".join(f"{k:>10}" for k in kinds) + f" {'total':>8}")
    for outcome in OUTCOMES:
        row = [counts[(k, outcome)] for k in kinds]
        print(f"{outcome:<18} " + " ".join(f"{n:>10}" for n in row) + f" {sum(row):>8}")
    bad = sum(n for (_, outcome), n in counts.items() if outcome in BAD)
    print(f"{sum(counts.values())} cases, {bad} bad ({', '.join(BAD)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
