"""Mutation check of the reproduction rules: do the rule tests notice when a threshold or an operator changes?

    python tools/mutate_rules.py            # `make mutate-rules`: every mutant, then "mutants killed K / total N (P %)"
    python tools/mutate_rules.py --list     # the mutants only, without running the tests

Each mutant changes one thing in analysis/reproduction_rules.py: a comparison flipped (< <=, > >=, == !=), and/or
swapped, + and - swapped, a numeric constant changed (x*2, x/2, x+1) or a bool negated. Numbers and operators inside
f-strings (the verdict's wording) and docstrings are not mutated: they are text, not rules. The mutated module is
written to a temporary directory and loaded in a forked child as `analysis.reproduction_rules` before the rule tests
run (`-x -q`, `TIMEOUT_S` each); the worktree's file is never written. A mutant is killed when the tests fail or time
out. Survivors the tests cannot kill, because the program means the same, are listed in `EQUIVALENT` with why.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "analysis" / "reproduction_rules.py"
MODULE = "analysis.reproduction_rules"
TESTS = ("tests/analysis/test_reproduction_rules.py", "tests/analysis/test_reproduction_thresholds.py")
TIMEOUT_S = 60
PRELOAD = ("pytest", "torch", "duckdb", "numpy")  # imported once before forking, so each mutant's run is quick

FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
SWAP_BOOL: dict[type[ast.boolop], type[ast.boolop]] = {ast.And: ast.Or, ast.Or: ast.And}
SWAP_BIN: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}

# Survivors that mean the same program, by (the line's code, the mutation); each with why no test can tell.
EQUIVALENT: dict[tuple[str, str], str] = {
    ("if lo > 0:", "op 0: > -> >="): "sharpness: lo = tanh(atanh(rho) - half) is exactly 0 only when atanh(rho) equals "
    "half, an irrational number no rank correlation of checkpoints hits",
    ("if hi < FOLLOWS:", "op 0: < -> <="): "sharpness: hi equals 0.3 exactly only for a rho no rank correlation hits, "
    "as for lo > 0",
    ('near = [abs(r["fault_fano"] / bound[r["node_label"]] - 1) <= 0.1 for r in nodes]', "op 0: <= -> <"): "bursts: "
    "x - 1 is exact for x in [0.5, 2] (Sterbenz) and 1 +- float(0.1) is not a float, so |x - 1| never equals 0.1",
    ('near = [abs(r["abft_recall"] - 0.5) <= 0.1 for r in nodes]', "op 0: <= -> <"): "abft: recall - 0.5 is exact "
    "near 0.5 and 0.5 +- float(0.1) is not a float, so the distance never equals 0.1",
    (
        'nodes = [r for r in fleet_nodes(rows) if (r["fault_steps"] or 0) >= 2 and r["fault_fano"] is not None]',
        "0 -> 1",
    ): "bursts: a missing fault_steps read as 1 instead of 0 is still below 2",
    ('nonfinite = sum(not math.isfinite(r["max_rel"] or 0) for r in nodes)', "0 -> 1"): "heavy_tail: 1 and 0 are "
    "both finite",
    ('worst = max((r["max_rel"] or 0 for r in nodes if math.isfinite(r["max_rel"] or 0)), default=0)', "0 -> 1"): (
        "heavy_tail: three 0s on this line; the filter's (1 and 0 both finite) survives; the test on a missing "
        "max_rel ('largest finite 0x') kills the other two, which share this key"
    ),
    ('near = [100 / 1.25 <= (r["max_rel"] or 0) <= 100 * 1.25 for r in nodes]', "0 -> 1"): "heavy_tail: a missing "
    "max_rel read as 1 instead of 0 is still far below 80",
    ('near = [floor / 2 <= (r["final_drift"] or 0) <= floor * 2 for r in nodes]', "0 -> 1"): "overlap: a missing "
    "drift read as 1 instead of 0 is still outside floor/2..2 floor (the floor is at most a drift, far below 1)",
    ('above = sum(1 for r in outside if r["disagreement"] > max(twins[r["task"]]))', "op 0: > -> >="): "disagreement: "
    "a result at the range's top is inside it, so no result counted here equals the top",
    ("bound = binomial_upper(len(nodes), min(1.0, 2 / (n + 1)))", "1.0 -> 2.0"): "disagreement: 2 / (n + 1) is at "
    "most 1 for n >= 1 twins, so the cap at 1 or 2 never binds",
}


@dataclass(frozen=True)
class Mutant:
    index: int  # the mutation point's place in `mutation_points` order
    line: int
    kind: str  # "compare", "boolop", "binop", "number" or "bool"
    what: str  # e.g. "op 0: < -> <=" or "0.5 -> 1.0"
    code: str  # the mutated line, stripped


def _number_variants(value: int | float) -> list[int | float]:
    halved = value // 2 if isinstance(value, int) else value / 2
    out: list[int | float] = []
    for v in (value * 2, halved, value + 1):
        if v != value and v not in out:
            out.append(v)
    return out


def _text_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside f-strings and docstrings: wording, not rules."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def mutation_points(tree: ast.AST) -> Iterator[tuple[ast.AST, int, str, str, object]]:
    """(node, line, kind, description, replacement) for every mutant of `tree`, in a stable order."""
    skip = _text_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in FLIP:
                    new = FLIP[type(op)]
                    yield node, line, "compare", f"op {i}: {_sym(op)} -> {_sym(new())}", (i, new)
        elif isinstance(node, ast.BoolOp) and type(node.op) in SWAP_BOOL:
            new_b = SWAP_BOOL[type(node.op)]
            yield node, line, "boolop", f"{_sym(node.op)} -> {_sym(new_b())}", new_b
        elif isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
            new_o = SWAP_BIN[type(node.op)]
            yield node, line, "binop", f"{_sym(node.op)} -> {_sym(new_o())}", new_o
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, line, "bool", f"{node.value} -> {not node.value}", not node.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            for v in _number_variants(node.value):
                yield node, line, "number", f"{node.value!r} -> {v!r}", v


def _sym(op: ast.AST) -> str:
    names = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
    names |= {ast.And: "and", ast.Or: "or", ast.Add: "+", ast.Sub: "-"}
    return names[type(op)]


def mutants(source: str) -> list[Mutant]:
    tree, lines = ast.parse(source), source.splitlines()
    points = enumerate(mutation_points(tree))
    return [Mutant(i, line, kind, what, lines[line - 1].strip()) for i, (_, line, kind, what, _) in points]


def apply(source: str, index: int) -> str:
    """`source` with mutant `index` applied, as source text (ast.unparse: comments and layout are gone)."""
    tree = ast.parse(source)
    for i, (node, _, kind, _, new) in enumerate(mutation_points(tree)):
        if i != index:
            continue
        if kind == "compare":
            at, op = new  # type: ignore[misc]  # new is a (place, op class) pair here
            node.ops[at] = op()  # type: ignore[attr-defined]  # node is an ast.Compare
        elif kind in ("boolop", "binop"):
            node.op = new()  # type: ignore[attr-defined,operator]  # a BoolOp or BinOp, new its op class
        else:
            node.value = new  # type: ignore[attr-defined]  # node is an ast.Constant
        return ast.unparse(tree)
    raise IndexError(f"mutant {index} does not exist: the source has {len(mutants(source))}")


def _child(source: str, workdir: Path, tests: tuple[str, ...]) -> int:
    """In the forked child: load `source` as the rules module from a temporary file, run the rule tests."""
    path = workdir / "reproduction_rules.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    spec.loader.exec_module(module)
    import analysis

    analysis.reproduction_rules = module  # type: ignore[attr-defined]  # the mutant replaces it
    import pytest

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    return int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))


def run_tests(source: str, tests: tuple[str, ...] = TESTS, timeout_s: int = TIMEOUT_S) -> bool:
    """Whether the rule tests pass with `source` as the rules module (in a forked child, `timeout_s` at most)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(timeout_s)
                code = _child(source, Path(tmp), tests)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0


def _preload() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    assert MODULE not in sys.modules, f"{MODULE} was imported before forking: mutants would not replace it"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutants, do not run the tests")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    source = TARGET.read_text()
    found = mutants(source)
    if args.list:
        for m in found:
            print(f"line {m.line}: {m.kind} {m.what}")
        print(f"{len(found)} mutants")
        return 0
    _preload()
    if not run_tests(ast.unparse(ast.parse(source))):
        print("the rule tests fail on the unmutated module: fix them first", file=sys.stderr)
        return 2
    survivors = []
    for m in found:
        if run_tests(apply(source, m.index)):
            survivors.append(m)
            print(f"survivor line {m.line}: {m.kind} {m.what}: {m.code}", file=sys.stderr, flush=True)
    killed = len(found) - len(survivors)
    print(f"mutants killed {killed} / total {len(found)} ({100 * killed / max(1, len(found)):.1f} %)")
    for m in survivors:
        why = EQUIVALENT.get((m.code, m.what), "NOT EXPLAINED: a test should kill it")
        print(f"  survivor line {m.line}: {m.kind} {m.what}: {m.code} -- {why}")
    unexplained = [m for m in survivors if (m.code, m.what) not in EQUIVALENT]
    return 1 if unexplained or killed < 0.95 * len(found) else 0


if __name__ == "__main__":
    sys.exit(main())
