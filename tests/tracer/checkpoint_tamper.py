"""A checkpoint changed the way a corrupted copy leaves it: a tensor and its manifest fingerprint together.

name = tamper_both(run, step)      # the checkpoint still passes its own manifest's check
"""

from __future__ import annotations

from pathlib import Path

import msgpack
from safetensors.torch import load, save_file

from tracer.checkpoint import checkpoint_dir
from tracer.fingerprint import fingerprint


def tamper_both(run: Path, step: int, rank: int = 0) -> str:
    """Change one model tensor of a plain checkpoint and its manifest fingerprint together (a corrupted copy):
    the checkpoint stays consistent with itself. Returns the tensor's name."""
    base = checkpoint_dir(run, step) / f"rank-{rank:05d}"
    st, mp = base.with_suffix(".safetensors"), base.with_suffix(".msgpack")
    tensors = load(st.read_bytes())
    name = next(k for k in sorted(tensors) if k.startswith("model/") and tensors[k].is_floating_point())
    t = tensors[name].clone()
    t.view(-1)[0] += 2.5e-6 * (1 + t.view(-1)[0].abs())
    tensors[name] = t
    save_file(tensors, str(st))
    manifest = msgpack.unpackb(mp.read_bytes(), raw=False, strict_map_key=False)
    manifest["fingerprints"][name] = f"{fingerprint(t):016x}"
    mp.write_bytes(msgpack.packb(manifest, use_bin_type=True))
    return name
