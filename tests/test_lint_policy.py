"""The type checker's escape hatch stays narrow (`make lint` runs mypy on tracer/, jobs/, replay/ and faults/):
every ``# type: ignore`` in the project names the error codes it silences and says why on the same line, as in
``x = f()  # type: ignore[attr-defined]  # the stub lacks f``. mypy itself refuses a codeless one and one no longer
needed in the packages it checks; this test covers every Python file, tests and benchmarks included."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from tests.test_dependencies import ROOT

_SKIPPED = {"__pycache__", "build", "runs", "demo"}  # outputs, not sources (.gitignore)
_IGNORE = re.compile(r"#\s*type:\s*ignore\b")
# codes in brackets, then the reason as a comment of its own
_EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z][a-z0-9-]*(?:,\s*[a-z][a-z0-9-]*)*\]\s+#\s*\S")


def python_files(root: Path = ROOT) -> list[Path]:
    """Every Python file of the project: hidden folders, virtual environments and build outputs left out."""
    found = []
    for path in root.iterdir():
        if path.name.startswith(".") or path.name in _SKIPPED or path.name.endswith(".egg-info"):
            continue
        if path.is_dir() and not (path / "pyvenv.cfg").exists():
            found += python_files(path)
        elif path.suffix == ".py":
            found.append(path)
    return sorted(found)


def unexplained_ignores(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line`` and comment of each ``# type: ignore`` in ``path`` without its codes or its reason."""
    source = path.read_text(encoding="utf-8")
    comments = (t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT)
    return [
        f"{path.relative_to(root)}:{t.start[0]}: {t.string}"
        for t in comments
        if _IGNORE.search(t.string) and not _EXPLAINED.search(t.string)
    ]


def test_every_type_ignore_names_its_codes_and_its_reason() -> None:
    unexplained = [line for p in python_files() for line in unexplained_ignores(p)]
    assert unexplained == [], "write `# type: ignore[code]  # why` (the code mypy reports), or fix the type"


def test_an_ignore_without_codes_or_reason_is_caught(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "a = f()  # type: ignore\n"
        "b = f()  # type: ignore[attr-defined]\n"
        "c = f()  # type:ignore  # no codes\n"
        "d = f()  # type: ignore[attr-defined]  # the stub lacks f\n"
        "e = f()  # type: ignore[arg-type, return-value]  # a str, as the caller gives\n"
        's = "# type: ignore in a string is no comment"\n'
    )
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "site.py").write_text("x = 1  # type: ignore\n")
    assert python_files(tmp_path) == [tmp_path / "pkg" / "m.py"]
    assert [line.split(": ", 1)[0] for line in unexplained_ignores(tmp_path / "pkg" / "m.py", tmp_path)] == [
        "pkg/m.py:1",
        "pkg/m.py:2",
        "pkg/m.py:3",
    ]
