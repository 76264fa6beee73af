"""A real incident bundle in a second, without recording a run: the shipped capture pieces (`OpRecorder`,
`write_bundle`) on one forward of a small MLP, and the edits a crafted or damaged bundle is made of.

    bundle = small_bundle(tmp_path / "INC")          # golden: the forward's output; suspect: one bit flipped
    edit_manifest(bundle, lambda m: m["ops"][0].update(op="aten.__self__.load_library"))
    flip_byte(bundle / "tensors.safetensors", -1)    # the last byte of the golden/suspect data
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from replay.bundle_files import write_bundle
from replay.bundle_ops import OpRecorder
from replay.capture import Captured, SiteKey
from tracer.log.records import Phase


def small_bundle(out: Path, *, dropout: float = 0.0, rng: bool = True) -> Path:
    """The bundle of ``layers.0``'s forward (Linear, GELU, Linear on an input of 4 x 8; with ``dropout``, a Dropout
    of that probability, training, before the second Linear), its suspect output the golden one with bit 27 of
    element 5 flipped; written by the shipped `write_bundle` into ``out``, without the RNG state the forward began
    with when ``rng`` is False (as a crafted bundle may lack it, its hash recorded anew)."""
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.GELU(), *([nn.Dropout(dropout)] if dropout else []), nn.Linear(16, 8)]
    module = nn.Sequential(*layers)
    x = torch.randn(4, 8)
    state = torch.get_rng_state()
    named = {f"param.{n}": p for n, p in module.named_parameters()}
    with torch.no_grad():
        recorder = OpRecorder({"input.0": x}, named)
        with recorder:
            y = module(x)
    suspect = y.clone()
    suspect.view(-1).view(torch.int32)[5] ^= 1 << 27
    captured = Captured(
        SiteKey(3, 0, "layers.0", Phase.FORWARD),
        checkpoint=2,
        device="cpu",
        module="Sequential",
        inputs={"input.0": x.clone()},
        named={k: v.detach().clone() for k, v in named.items()},
        rng=state if rng else None,
        ops=recorder.ops,
        constants=recorder.constants,
        outputs=recorder.output_refs([y]),
        golden=[y.clone()],
        suspect=[suspect],
    )
    out.mkdir(parents=True)
    write_bundle(captured, out, golden={"path": "golden", "run_id": "g"}, suspect={"node_label": "suspect"})
    return out


def edit_manifest(bundle: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``change`` to the bundle's manifest and write it back (the tensors' recorded hash untouched)."""
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    change(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")


def flip_byte(path: Path, offset: int) -> None:
    """Flip the low bit of the byte at ``offset`` (negative: from the end)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def swap_for(path: Path, kind: str) -> None:
    """Put something that is not a regular file where ``path`` was: a FIFO, a directory, a link to /dev/zero, or
    nothing (``missing``)."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind != "missing":
        raise ValueError(f"swap_for: no kind {kind!r}")
