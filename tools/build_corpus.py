"""Build the embedded training corpus from the Python standard library's docstrings.

    python tools/build_corpus.py            # rewrites workload/corpus/

The workload must see the same bytes on every machine and Python version, with no
download, so the corpus is built once, committed, and only read at run time. This
tool is how it was made: the docstrings of a fixed, sorted list of stdlib modules,
parsed from source with `ast` (nothing is imported), in source order, duplicates
dropped, joined by blank lines, gzipped with mtime 0 so the file's bytes depend
only on the text. Run it with a different Python and the text will differ: the
committed file, not this tool, is the reference; LICENSE records which Python made it.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import platform
import sys
import sysconfig
from pathlib import Path

# Pure-Python modules and packages with plenty of prose, present in CPython 3.10-3.13.
MODULES = sorted(
    [
        "_collections_abc",
        "_pydecimal",
        "_pyio",
        "argparse",
        "ast",
        "asyncio",
        "bdb",
        "calendar",
        "cmd",
        "codecs",
        "collections",
        "concurrent",
        "configparser",
        "contextlib",
        "csv",
        "ctypes",
        "dataclasses",
        "datetime",
        "difflib",
        "dis",
        "doctest",
        "email",
        "enum",
        "fileinput",
        "fractions",
        "ftplib",
        "functools",
        "gettext",
        "glob",
        "gzip",
        "hashlib",
        "heapq",
        "hmac",
        "http",
        "imaplib",
        "importlib",
        "inspect",
        "ipaddress",
        "json",
        "locale",
        "logging",
        "lzma",
        "mailbox",
        "mimetypes",
        "multiprocessing",
        "operator",
        "optparse",
        "os",
        "pathlib",
        "pdb",
        "pickle",
        "pickletools",
        "pkgutil",
        "platform",
        "plistlib",
        "poplib",
        "pprint",
        "pydoc",
        "queue",
        "random",
        "re",
        "sched",
        "selectors",
        "shelve",
        "shlex",
        "shutil",
        "site",
        "smtplib",
        "socket",
        "socketserver",
        "ssl",
        "statistics",
        "string",
        "subprocess",
        "tarfile",
        "tempfile",
        "textwrap",
        "threading",
        "timeit",
        "tokenize",
        "trace",
        "traceback",
        "types",
        "typing",
        "unittest",
        "urllib",
        "uuid",
        "warnings",
        "wave",
        "weakref",
        "wsgiref",
        "xml",
        "xmlrpc",
        "zipfile",
        "zipimport",
    ]
)
MAX_BYTES = 2_000_000  # keep the committed file small; cut at a docstring boundary
OUT_DIR = Path(__file__).resolve().parent.parent / "workload" / "corpus"
CORPUS_NAME = "stdlib-docstrings.txt.gz"


def source_files(stdlib: Path, module: str) -> list[Path]:
    """The module's file, or every .py file of the package, sorted, tests excluded."""
    package = stdlib / module
    if package.is_dir():
        return sorted(
            p for p in package.rglob("*.py") if not {"test", "tests", "idle_test"} & set(p.relative_to(package).parts)
        )
    single = stdlib / f"{module}.py"
    if not single.is_file():
        sys.exit(
            f"build_corpus: stdlib module {module!r} not found under {stdlib}; "
            "remove it from MODULES or use another Python"
        )
    return [single]


def docstrings(path: Path) -> list[str]:
    """Docstrings of the module, its classes and functions, in source order."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = (ast.get_docstring(node, clean=True) or "").strip()
            if doc:
                found.append(doc)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_bytes(), filename=str(path)))
    return found


def build_text(stdlib: Path) -> bytes:
    seen: set[str] = set()
    parts: list[bytes] = []
    size = 0
    for module in MODULES:
        for path in source_files(stdlib, module):
            for doc in docstrings(path):
                if doc in seen:
                    continue
                seen.add(doc)
                chunk = doc.encode("utf-8") + b"\n\n"
                if size + len(chunk) > MAX_BYTES:
                    return b"".join(parts)
                parts.append(chunk)
                size += len(chunk)
    return b"".join(parts)


def gzip_bytes(data: bytes) -> bytes:
    buffer = io.BytesIO()
    # mtime=0 and no file name in the header: the output depends only on the text.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as f:
        f.write(data)
    return buffer.getvalue()


def notice(text: bytes, license_text: str) -> str:
    return (
        f"{CORPUS_NAME}\n"
        "\n"
        "Docstrings extracted by tools/build_corpus.py from the source of the Python\n"
        f"standard library, CPython {platform.python_version()}, modules:\n"
        f"{', '.join(MODULES)}.\n"
        f"Uncompressed size {len(text)} bytes, sha256 {hashlib.sha256(text).hexdigest()}.\n"
        "\n"
        "Copyright (c) 2001 Python Software Foundation; All Rights Reserved.\n"
        "Used under the PSF License Agreement, reproduced below with the rest of\n"
        "CPython's LICENSE file.\n"
        "\n" + "=" * 78 + "\n\n" + license_text
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    args = parser.parse_args(argv)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    license_path = stdlib / "LICENSE.txt"
    if not license_path.is_file():
        sys.exit(f"build_corpus: {license_path} not found; this Python ships no license file to copy beside the corpus")
    text = build_text(stdlib)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / CORPUS_NAME).write_bytes(gzip_bytes(text))
    (args.out / "LICENSE").write_text(notice(text, license_path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {args.out / CORPUS_NAME}: {len(text)} bytes of text, sha256 {hashlib.sha256(text).hexdigest()}")


if __name__ == "__main__":
    main()
