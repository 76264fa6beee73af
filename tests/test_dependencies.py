"""Dependencies between the top-level packages run one way (docs/architecture.md).

Every ``import`` and ``from ... import`` in every module is checked, including those
inside functions, so a lazy import cannot slip a forbidden edge past the rules.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tracer", "faults", "workload", "replay", "jobs", "pipelines", "analysis", "sdc")

# package -> the project packages it must never import. `jobs` orchestrates (claims run directories, launches
# ranks, runs record/replay/fine-tune/verify jobs): it may use tracer, faults, workload and replay, and nothing
# below it imports it.
FORBIDDEN: dict[str, frozenset[str]] = {
    "tracer": frozenset(PACKAGES) - {"tracer"},
    "faults": frozenset({"workload", "replay", "jobs", "pipelines", "analysis", "sdc"}),
    "workload": frozenset({"replay", "jobs", "pipelines", "analysis", "sdc"}),
    "replay": frozenset({"jobs", "pipelines", "analysis", "sdc"}),
    "jobs": frozenset({"pipelines", "analysis", "sdc"}),
    "pipelines": frozenset({"replay", "workload", "faults", "jobs", "sdc"}),
    "analysis": frozenset({"replay", "workload", "faults", "jobs", "pipelines", "sdc"}),
    "sdc": frozenset(),
}

# A dotted module path in a string (``"sdc.commands.record:record_rank"``, ``importlib.import_module("jobs.x")``):
# code imported by name at run time is an import like any other.
_MODULE_STRING = re.compile(r"([a-z_][a-z0-9_]*)(\.[a-z_][a-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_]*)?")


def imported_packages(source: str, path: Path) -> set[tuple[str, int]]:
    """(top-level project package, line) of every import in ``source``, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value):
            names = [node.value]
        else:
            continue
        found.update((n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in PACKAGES)
    return found


def violations(package: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for imported, line in sorted(imported_packages(path.read_text(encoding="utf-8"), path), key=lambda x: x[1]):
            if imported in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(root)}:{line} imports {imported}")
    return bad


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_follow_the_rules(package: str) -> None:
    assert (ROOT / package / "__init__.py").is_file(), f"{package}/ is not a package"
    assert violations(package) == []


def test_a_forbidden_import_inside_a_function_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tracer").mkdir()
    (tmp_path / "tracer" / "sneaky.py").write_text(
        "import torch\n\ndef later():\n    from workload.train import build\n    import replay.replayer as e\n"
    )
    assert violations("tracer", tmp_path) == [
        "tracer/sneaky.py:4 imports workload",
        "tracer/sneaky.py:5 imports replay",
    ]


def test_a_module_named_in_a_string_is_an_import(tmp_path: Path) -> None:
    (tmp_path / "tracer").mkdir()
    (tmp_path / "tracer" / "by_name.py").write_text(
        'import importlib\n\nTARGET = "sdc.commands.record:record_rank"\n'
        'def later():\n    return importlib.import_module("jobs.launch")\n'
        'NOTE = "see the jobs package, sdc.commands"\n'
    )
    assert violations("tracer", tmp_path) == [
        "tracer/by_name.py:3 imports sdc",
        "tracer/by_name.py:5 imports jobs",
    ]


# The extras' frameworks: only the integration modules that adapt to them may import them.
FRAMEWORKS = ("transformers", "accelerate", "pytorch_lightning", "lightning", "lightning_fabric")
INTEGRATIONS = ("tracer.integrations.hf", "tracer.integrations.lightning")


@pytest.mark.slow  # a fresh Python process (or a compile) of a few seconds
def test_importing_tracer_imports_no_training_framework() -> None:
    code = (
        "import importlib, pkgutil, sys, tracer\n"
        "for m in pkgutil.walk_packages(tracer.__path__, 'tracer.'):\n"
        f"    if m.name not in {INTEGRATIONS!r}: importlib.import_module(m.name)\n"
        f"print(sorted(set({FRAMEWORKS!r}) & set(sys.modules)))\n"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert found.stdout.strip() == "[]"


@pytest.mark.slow  # a fresh Python process (or a compile) of a few seconds
def test_a_traced_process_does_not_import_what_only_sharded_checkpoints_need() -> None:
    """torch.distributed.checkpoint takes most of a second to import: a Tracer on a plain model, and the record and
    replay jobs, load it only when a sharded checkpoint is saved or restored (tracer.checkpoint.step)."""
    code = "import sys, tracer.tracing, jobs.record, jobs.replay; print('torch.distributed.checkpoint' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert found.stdout.strip() == "False"


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Project module -> the project modules it imports, at any depth (inside functions and ``TYPE_CHECKING`` too).

    ``from a.b import c`` is an edge to ``a.b.c`` where that is a module, else to ``a.b``; a name that is no module
    of the project is followed up to the nearest one that is."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)

    def nearest(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        names = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                names += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        graph[module] = {found for name in names if (found := nearest(name)) not in (None, module)}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (``[a, b, ..., a]``) through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = set(stack[stack.index(module) :])
            del stack[stack.index(module) :]
            if len(group) > 1:
                circles.append(_circle_in(group, graph))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def _circle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for other in sorted(graph[module] & group):
                if other == start:
                    return paths[module] + [start]
                if other not in paths:
                    paths[other] = paths[module] + [other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


def test_no_import_circle_in_any_package() -> None:
    circles = import_circles(module_graph())
    assert circles == [], "import circles: " + "; ".join(" -> ".join(circle) for circle in circles)


def test_an_import_circle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "__init__.py").write_text("")
    (tmp_path / "pipelines" / "a.py").write_text("from pipelines.b import run\n")
    (tmp_path / "pipelines" / "b.py").write_text("def run():\n    from . import c\n")
    (tmp_path / "pipelines" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pipelines.a\n"
    )
    (tmp_path / "pipelines" / "d.py").write_text("import pipelines.a\n")
    assert import_circles(module_graph(tmp_path)) == [["pipelines.a", "pipelines.b", "pipelines.c", "pipelines.a"]]
