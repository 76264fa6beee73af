"""Rules of the code base that keep it navigable (docs/architecture.md): small modules, and no module reaching
into another's private names. Checked over every module of every package, so a change that breaks one fails
here with the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_dependencies import PACKAGES, ROOT

MAX_LINES = 600  # a module longer than this has more than one job: split it along its seams


def modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``from <project module> import _name`` in ``path``: a private name used outside its own module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in PACKAGES
        ):
            found += [
                f"{path.relative_to(root)}:{node.lineno} imports {node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_no_module_is_over_the_line_limit() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert long == [], f"modules over {MAX_LINES} lines: split them along their seams"


def test_no_private_name_is_imported_from_another_module() -> None:
    assert [line for p in modules() for line in private_imports(p)] == []


def test_a_private_import_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tracer").mkdir()
    (tmp_path / "tracer" / "reach.py").write_text(
        "from tracer.log.reader import LogReader, _load\nfrom tracer import __version__\n"
    )
    assert private_imports(tmp_path / "tracer" / "reach.py", tmp_path) == [
        "tracer/reach.py:1 imports tracer.log.reader._load"
    ]
