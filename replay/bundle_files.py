"""Write an incident bundle: ``tensors.safetensors``, ``manifest.json`` and ``reproduce.py``.

    manifest = write_bundle(captured, out, golden={"path": ..., "run_id": ...}, suspect=suspect.source)

``tensors.safetensors`` holds the site's inputs (``input.N``, ``input.<keyword>``), parameters and buffers
(``param.<name>``, ``buffer.<name>``), the constants its ops read (``const.N``), the torch RNG state as its
forward began (``rng.cpu``) and the golden and suspect outputs (``golden.output.N``, ``suspect.output.N``), each
stored contiguous; the manifest gives the strides they had. Written by the few lines of `write_safetensors` (no
pickle, no dependency); any safetensors reader loads the file. ``reproduce.py`` is replay/bundle_reproduce.py,
copied, beside ``bundle_check.py`` (replay/bundle_check.py), which checks the bundle before it runs, and
``bounded_read.py`` (tracer/bounded_read.py), the JSON reader it uses. The manifest
(format ``sdctrace-incident/1``) holds the site, the versions, the op list, the files with their SHA-256, the
fingerprints and the defect signature of each output (replay/signature.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from replay import bundle_check, bundle_reproduce
from replay.bundle_ops import describe_tensor
from replay.capture import Captured
from replay.signature import defect_signature
from tracer import bounded_read
from tracer.fingerprint import fingerprint
from tracer.header import software_versions
from tracer.log.claim import FolderKind
from tracer.log.layout import LOCK_FILE

CODES = {dtype: code for code, dtype in bundle_check.DTYPES.items()}
SCRIPT = "reproduce.py"
FILES = (bundle_check.MANIFEST, bundle_check.TENSORS, SCRIPT, bundle_check.CHECKER, bundle_check.READER)


def bundle_written(parts: tuple[str, ...], is_dir: bool) -> bool:
    """Whether ``<bundle>/<parts...>`` is a name a bundle holds (its reproductions' verdicts.jsonl too)."""
    return len(parts) == 1 and not is_dir and parts[0] in (*FILES, bundle_check.VERDICTS_FILE, LOCK_FILE)


INCIDENT_FOLDER = FolderKind("bundle", bundle_written)


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """``tensors`` in the safetensors format: an 8-byte little-endian header length, a JSON header, the bytes."""
    header: dict[str, Any] = {"__metadata__": metadata or {}}
    chunks, offset = [], 0
    for name, t in tensors.items():
        if t.dtype not in CODES:
            raise ValueError(f"{name}: {t.dtype} has no safetensors code here")
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for data in chunks:
            f.write(data)


def write_bundle(c: Captured, out: Path, *, golden: dict[str, Any], suspect: dict[str, Any]) -> dict[str, Any]:
    """Write the bundle of ``c`` into ``out`` (claimed by the caller); returns the manifest."""
    stored = {**c.inputs, **c.named, **c.constants}
    tensors = dict(stored)
    if c.rng is not None:
        tensors["rng.cpu"] = c.rng
    tensors |= {f"golden.output.{j}": t for j, t in enumerate(c.golden)}
    tensors |= {f"suspect.output.{j}": t for j, t in enumerate(c.suspect)}
    write_safetensors(out / bundle_check.TENSORS, tensors, {"format": bundle_check.FORMAT})
    (out / SCRIPT).write_bytes(Path(bundle_reproduce.__file__).read_bytes())
    (out / bundle_check.CHECKER).write_bytes(Path(bundle_check.__file__).read_bytes())
    (out / bundle_check.READER).write_bytes(Path(bounded_read.__file__).read_bytes())
    manifest = {
        "format": bundle_check.FORMAT,
        "created_unix": time.time(),
        "site": c.site.to_json(),
        "module": c.module,
        "device": c.device,
        "checkpoint": c.checkpoint,
        "versions": software_versions(),
        "golden": golden,
        "suspect": {**suspect, "output_from": c.suspect_source, "inputs_were_golden": c.suspect_inputs_golden},
        # False: re-executing golden here gave other bits at the site itself than its log (nondeterminism here?)
        "golden_reexecution_matched_log": c.golden_matched_log,
        # the first tensor after the site whose re-execution differed from golden's log ("" if none): nothing the
        # bundle holds came from it
        "golden_reexecution_differed_after": c.golden_differed_after,
        # draws from generators of the model's own; those seeded differently in golden and the suspect are drawn
        # anew on each run of reproduce.py, as the model does
        "generators": {"draws": len(c.seeds), "drawn_afresh": c.drawn_afresh},
        "faults": c.faults,
        "tensors": {name: describe_tensor(t) for name, t in stored.items()},
        "ops": c.ops,
        "outputs": c.outputs,
        "output_meta": [describe_tensor(t) for t in c.golden],
        "fingerprints": {
            "logged": f"{c.logged:016x}" if c.logged is not None else None,
            "golden": [f"{fingerprint(t):016x}" for t in c.golden],
            "suspect": [f"{fingerprint(t):016x}" for t in c.suspect],
        },
        "signatures": signatures(c),
    }
    manifest["files"] = {name: _sha256(out / name) for name in FILES[1:]}
    (out / bundle_check.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def signatures(c: Captured) -> list[dict[str, Any]]:
    """The defect signature of each floating output whose golden and suspect bits differ."""
    found = []
    for j, (g, s) in enumerate(zip(c.golden, c.suspect)):
        if not g.is_floating_point() or g.shape != s.shape or bundle_check.same_bits(g, s):
            continue
        found.append(
            {
                "output": j,
                **defect_signature(
                    g, s, op=computed_by(c.ops, c.outputs[j]), step=c.site.step, site=c.site.name
                ).to_json(),
            }
        )
    return found


# Ops that only relabel their first argument's elements: an output made by one was computed by the op before.
VIEWS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "alias",
        "detach",
        "contiguous",
        "clone",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
    }
)


def computed_by(ops: list[dict[str, Any]], ref: str) -> str | None:
    """The op that computed the values of ``ref`` (past the views and copies that only moved them)."""
    while ref.startswith("op."):
        op = ops[int(ref.split(".")[1])]
        first = op["args"][0] if op["args"] else None
        if op["op"].split(".")[1] not in VIEWS or not (isinstance(first, dict) and "t" in first):
            return op["op"]
        ref = first["t"]
    return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
