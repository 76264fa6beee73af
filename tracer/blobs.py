"""Content-addressed store of full tensors, keyed by their fingerprint.

A blob's location is derived from its fingerprint alone, never from a path read
out of a log, so a log cannot point a reader at an arbitrary file. Files are
safetensors (no pickle) written atomically; a blob written twice is stored once.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

from tracer.errors import LogError
from tracer.fingerprint import fingerprint
from tracer.log.layout import BLOB_DIR
from tracer.regular_files import read_regular


class BlobStore:
    """Full tensors of one run, addressed by 64-bit fingerprint."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir) / BLOB_DIR

    def path(self, fp: int) -> Path:
        h = f"{fp & ((1 << 64) - 1):016x}"
        return self.root / h[:2] / f"{h}.safetensors"

    def __contains__(self, fp: int) -> bool:
        return self.path(fp).is_file()

    def put(self, fp: int, tensor: torch.Tensor) -> Path:
        """Store ``tensor`` (already on the CPU) under ``fp`` unless it is already there."""
        dest = self.path(fp)
        if dest.is_file():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(f".tmp{os.getpid()}")
        save_file({"tensor": tensor.contiguous()}, str(tmp), metadata={"fingerprint": f"{fp:016x}"})
        os.replace(tmp, dest)
        return dest

    def get(self, fp: int, *, verify: bool = True) -> torch.Tensor:
        """Load the tensor stored under ``fp``; with ``verify``, prove it still has those bits."""
        src = self.path(fp)
        if not os.path.lexists(src):
            raise LogError(
                f"{src}: blob {fp:016x} is missing; copy the run's {BLOB_DIR}/ directory "
                "along with its logs, or record again with a capture policy that includes it"
            )
        data = read_regular(src, "blob")  # a FIFO or /dev/zero in its place: an error, not a hang
        try:
            tensor = load(data)["tensor"]
        except (SafetensorError, KeyError, OSError) as exc:
            raise LogError(f"{src}: unreadable blob ({exc}); delete it and capture again") from exc
        if verify and fingerprint(tensor) != fp:
            raise LogError(f"{src}: blob content does not match its fingerprint {fp:016x} (corrupted on disk)")
        return tensor
