"""sdctrace's C++ kernels, built once per machine with torch's C++ extension tooling.

    python -m tracer.kernel          # build the fused digest kernel (``make venv`` does); prints where it went

A `Kernel` names one source file and the module it builds; `tracer` owns the digest kernel
(digest.cpp) and other packages declare theirs the same way (faults/abft_kernel.py). A
training process never compiles: it loads a built module if there is one and otherwise
its caller falls back to torch ops and says so once. The build directory is keyed on the
source, its path, the flags, torch and Python, so an upgrade builds afresh instead of
loading a stale module, and two checkouts never rebuild each other's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from tracer.errors import TraceWarning

DIR_ENV = "SDCTRACE_KERNEL_DIR"  # where built kernels live (default ~/.cache/sdctrace/kernel)
# -fopenmp makes at::parallel_for split work over torch's intra-op threads (without it the pragma is dropped and
# the loop runs on one thread) and lets `omp simd` reductions vectorise; the library it links, libgomp.so.1,
# resolves to the one torch has loaded already.
CFLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp")
LDFLAGS = ("-fopenmp",)


@dataclass(frozen=True)
class Kernel:
    """One C++ source built into one extension module."""

    name: str  # the module's name, unique among sdctrace's kernels
    source: Path
    title: str  # what messages call it ("digest kernel")
    fallback: str  # what runs without it, for the message when building fails


DIGEST = Kernel(
    "sdctrace_digest",
    Path(__file__).with_name("digest.cpp"),
    "digest kernel",
    "tracing falls back to torch ops (same fingerprints, slower)",
)


def build_dir(kernel: Kernel) -> Path:
    """Where this kernel's source, with its flags, for this torch and Python, is built. The source's path is part
    of the key: the build files name it, so two checkouts sharing one cache would otherwise rebuild in turn."""
    key = hashlib.sha256()
    for part in (
        kernel.source.read_bytes(),
        str(kernel.source.resolve()).encode(),
        torch.__version__.encode(),
        sys.version.encode(),
        platform.machine().encode(),
        " ".join(CFLAGS).encode(),
        " ".join(LDFLAGS).encode(),
    ):
        key.update(part)
    root = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "sdctrace" / "kernel")
    return root / key.hexdigest()[:16]


def _library(kernel: Kernel, folder: Path) -> Path:
    return folder / f"{kernel.name}.so"  # what cpp_extension names it on Linux and macOS


def load(kernel: Kernel) -> ModuleType | None:
    """The built module, or None when it has not been built for this source, torch and Python."""
    path = _library(kernel, build_dir(kernel))
    if not path.is_file():
        return None
    loader = importlib.machinery.ExtensionFileLoader(kernel.name, str(path))
    spec = importlib.util.spec_from_file_location(kernel.name, path, loader=loader)
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_once(
    kernel: Kernel, state: list[ModuleType | None], lock: threading.Lock, env: str, missing: str
) -> ModuleType | None:
    """The module a caller keeps in ``state`` ([] until this fills it, once per process): None where ``env`` is
    "torch" (torch ops asked for) or the kernel is not built, which ``missing`` then says once as a TraceWarning
    pointing at the caller's caller."""
    with lock:
        if not state:
            module = None
            if os.environ.get(env) != "torch":
                module = load(kernel)
                if module is None:
                    warnings.warn(missing, TraceWarning, stacklevel=4)
            state.append(module)
    return state[0]


def build(kernel: Kernel, verbose: bool = False) -> Path:
    """Compile the kernel into `build_dir()` (a no-op when it is there) and return the library's path."""
    from torch.utils import cpp_extension

    folder = build_dir(kernel)
    folder.mkdir(parents=True, exist_ok=True)
    with _building(kernel, folder):
        # torch's lock file outlives a build that was killed, and torch then waits on it forever without a word.
        # Under `_building`'s lock, which the system drops when its holder dies, any such file is stale.
        (folder / "lock").unlink(missing_ok=True)
        cpp_extension.load(
            kernel.name,
            [str(kernel.source)],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(folder),
            verbose=verbose,
        )
    return _library(kernel, folder)


@contextlib.contextmanager
def _building(kernel: Kernel, folder: Path) -> Iterator[None]:
    """One build of ``folder`` at a time, saying so when this one waits for another."""
    with open(folder / "sdctrace-build.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"sdctrace: another process is building the {kernel.title} in {folder}; waiting for it",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file drops the lock


def build_main(kernel: Kernel, argv: list[str]) -> int:
    """A build command's body (``python -m tracer.kernel``, ``python -m faults.abft_kernel``): 0 when built."""
    try:
        path = build(kernel, verbose="--verbose" in argv)
    except Exception as e:  # the compiler's own output is above; one line says what to do
        print(
            f"sdctrace: building the {kernel.title} failed ({type(e).__name__}: {e}); {kernel.fallback}. "
            "Needs a C++17 compiler and ninja.",
            file=sys.stderr,
        )
        return 1
    print(f"sdctrace {kernel.title}: {path}")
    return 0
