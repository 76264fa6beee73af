"""The fused CPU digest kernel (digest.cpp), built once per machine with torch's C++ extension tooling.

    python -m tracer.kernel          # build it (``make venv`` does); prints where it went

A training process never compiles: it loads the built module if there is one and otherwise
`tracer.fingerprint` falls back to torch ops, which give the same fingerprint bits at several
times the cost, and says so once. The build directory is keyed on the source, torch and
Python versions, so an upgrade builds afresh instead of loading a stale module.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("digest.cpp")
NAME = "sdctrace_digest"
DIR_ENV = "SDCTRACE_KERNEL_DIR"  # where built kernels live (default ~/.cache/sdctrace/kernel)
CFLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math")


def build_dir() -> Path:
    """Where this source, for this torch and Python, is built."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(), platform.machine().encode(),
                 " ".join(CFLAGS).encode()):
        key.update(part)
    root = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "sdctrace" / "kernel")
    return root / key.hexdigest()[:16]


def _library(folder: Path) -> Path:
    return folder / f"{NAME}.so"  # what cpp_extension names it on Linux and macOS


def load() -> ModuleType | None:
    """The built kernel, or None when it has not been built for this source, torch and Python."""
    path = _library(build_dir())
    if not path.is_file():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build(verbose: bool = False) -> Path:
    """Compile the kernel into `build_dir()` (a no-op when it is there) and return the library's path."""
    from torch.utils import cpp_extension

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(NAME, [str(SOURCE)], extra_cflags=list(CFLAGS), build_directory=str(folder), verbose=verbose)
    return _library(folder)
