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
    replay jobs, load it only when a sharded checkpoint is saved or restored (tracer.step_checkpoint)."""
    code = "import sys, tracer.tracing, jobs.record, jobs.replay; print('torch.distributed.checkpoint' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert found.stdout.strip() == "False"
