"""The public face (docs/api.md): what each package's ``__all__`` exports resolves and is public, what the type
checkers see is what runs, importing a package stays cheap, and every project name the README, docs/*.md and
examples/*.py import is exported by the module it is imported from. Adding or removing a public name means
changing the ``__all__`` it is in, and this test shows where."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from tests.test_dependencies import PACKAGES, ROOT
from tracer.exports import lazy_exports

LAZY = ("tracer", "faults", "replay", "workload")  # resolve their names on first use (tracer.exports)
# Modules with an ``__all__`` users import from; the framework ones need the extras.
PUBLIC = (*LAZY, "tracer.guard", "tracer.log", "tracer.integrations.hf", "tracer.integrations.lightning")
PUBLIC += ("workload.hf", "workload.lightning")
FRAMEWORKS = frozenset({"transformers", "accelerate", "pytorch_lightning", "lightning"})
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py")))


def public(name: str) -> types.ModuleType:
    """Import module ``name``, skipping where it needs a training framework that is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name in FRAMEWORKS:
            pytest.skip(f"{name} needs {exc.name}: install the extras, pip install -e '.[hf,lightning]'")
        raise


def export_problems(module: types.ModuleType) -> list[str]:
    """What is wrong with ``module``'s ``__all__``: missing, a name twice, private, or not resolving."""
    names = getattr(module, "__all__", None)
    if names is None:
        return [f"{module.__name__} has no __all__"]
    problems = [f"{module.__name__}.{n} is listed twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for name in names:
        if name.startswith("_"):
            problems.append(f"{module.__name__}.{name} is private")
        elif not hasattr(module, name):
            problems.append(f"{module.__name__}.{name} does not resolve")
    return problems


@pytest.mark.parametrize("name", PUBLIC)
def test_every_exported_name_resolves_and_is_public(name: str) -> None:
    assert export_problems(public(name)) == []


def test_a_missing_twice_listed_or_private_export_is_caught() -> None:
    module = types.ModuleType("fake")
    vars(module).update(__all__=["_hidden", "gone", "there", "there"], _hidden=1, there=1)
    assert export_problems(module) == [
        "fake.there is listed twice",
        "fake._hidden is private",
        "fake.gone does not resolve",
    ]
    assert export_problems(types.ModuleType("bare")) == ["bare has no __all__"]


def type_checking_imports(package: str) -> dict[str, str]:
    """name -> module of the imports under ``if TYPE_CHECKING:`` in ``package``'s ``__init__.py``."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    return {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}


@pytest.mark.parametrize("package", LAZY)
def test_what_type_checkers_see_is_what_runs(package: str) -> None:
    """The ``if TYPE_CHECKING:`` imports list ``__all__``, and each name resolves to the object they name."""
    module = importlib.import_module(package)
    static = type_checking_imports(package)
    assert sorted(static) == sorted(module.__all__)
    wrong = [
        f"{package}.{name}: {origin} says one thing, the package resolves another"
        for name, origin in static.items()
        if getattr(module, name) is not getattr(importlib.import_module(origin), name)
    ]
    assert wrong == []
    assert set(module.__all__) <= set(dir(module))


def test_a_name_exported_from_two_modules_is_refused() -> None:
    with pytest.raises(ValueError, match="'x' is exported from both a.one and a.two"):
        lazy_exports("a", {"a.one": ("x",), "a.two": ("x", "y")})


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    import tracer

    with pytest.raises(AttributeError, match="module 'tracer' has no attribute 'Tracr'"):
        tracer.Tracr  # noqa: B018 - the lookup is the test
    from tracer import typed_toml  # a submodule, not an export: the import system falls back to it

    assert typed_toml.__name__ == "tracer.typed_toml"


def test_importing_the_packages_imports_nothing_behind_them() -> None:
    """A training process imports `tracer` first: that costs no torch and none of tracer's modules."""
    code = (
        f"import sys, {', '.join(LAZY)}\n"
        f"print(sorted(m for m in sys.modules if m == 'torch' or m.split('.')[0] in {PACKAGES!r}))\n"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert found.stdout.strip() == str(sorted([*LAZY, "tracer.exports"]))


@pytest.mark.slow  # a fresh Python process that imports torch: a few seconds
def test_the_user_api_imports_in_a_fresh_process() -> None:
    """The line issue 46 names, and it leaves torch.distributed.checkpoint (0.8 s) to a sharded checkpoint."""
    code = (
        "from tracer import Tracer, RunInfo, TraceOptions, configure_determinism, Guard\n"
        "import sys; print('torch.distributed.checkpoint' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "False"


# -- what the README, docs and examples import -------------------------------------------------------------------

_BLOCK = re.compile(r"^```(?:python|py)\n(.*?)^```", re.S | re.M)
_IMPORT_LINE = re.compile(r"^\s*from\s+[\w.]+\s+import\s+[^()]+$")


def code_of(path: Path) -> list[str]:
    """The Python code in ``path``: the file itself, or a Markdown file's python blocks."""
    text = path.read_text(encoding="utf-8")
    return [text] if path.suffix == ".py" else _BLOCK.findall(text)


def project_imports(code: str) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of each ``from <project package> import ...`` in ``code``. A block that is not whole
    Python (a sketch with ``...`` in an argument list) is read line by line."""
    try:
        nodes = list(ast.walk(ast.parse(code)))
    except SyntaxError:
        lines = [ln.split("#")[0].strip() for ln in code.splitlines() if _IMPORT_LINE.match(ln.split("#")[0])]
        nodes = [n for ln in lines for n in ast.walk(ast.parse(textwrap.dedent(ln)))]
    return [
        (n.module, tuple(a.name for a in n.names))
        for n in nodes
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and n.module.split(".")[0] in PACKAGES
    ]


def documented_imports() -> list[tuple[str, str, tuple[str, ...]]]:
    """(document, module, names) of every project import in the README, docs/*.md and examples/*.py."""
    return [
        (str(path.relative_to(ROOT)), module, names)
        for path in DOCUMENTS
        for code in code_of(path)
        for module, names in project_imports(code)
    ]


def test_the_documents_import_something() -> None:
    """The scan below finds the imports it checks: the README's own example is among them."""
    readme = ("README.md", "tracer", ("RunInfo", "Tracer", "TraceOptions", "configure_determinism"))
    assert readme in documented_imports()


def test_a_sketch_that_is_not_whole_python_is_read_line_by_line() -> None:
    sketch = "from tracer import Tracer  # the Tracer\n\ndef build(config, ...):\n    from faults import load_profile\n"
    assert project_imports(sketch) == [("tracer", ("Tracer",)), ("faults", ("load_profile",))]


@pytest.mark.parametrize(
    ("document", "module", "names"),
    [pytest.param(*d, id=f"{d[0]}: from {d[1]} import {', '.join(d[2])}") for d in documented_imports()],
)
def test_a_documented_import_is_a_public_one(document: str, module: str, names: tuple[str, ...]) -> None:
    """Every project name the README, docs/*.md and examples/*.py import resolves, and is in the ``__all__`` of the
    module it is imported from: users are shown the public face, never a module that may change."""
    imported = public(module)
    assert [n for n in names if not hasattr(imported, n)] == [], f"{document}: from {module} import {names}"
    exported = getattr(imported, "__all__", ())
    assert [n for n in names if n not in exported] == [], f"{document}: import these from a module's __all__"


@pytest.mark.parametrize("package", LAZY)
def test_docs_api_documents_every_public_name(package: str) -> None:
    """docs/api.md is the facade's documentation: a name added to an ``__all__`` gets its line and example there."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    exported = importlib.import_module(package).__all__
    assert [n for n in exported if f"`{n}`" not in text] == [], "docs/api.md: document these"
