"""The plain checkpoint, each rank's own two files: what a later process resumes a step from, bit for bit (the
implementation for a model without DTensor parameters; `tracer.checkpoint.interface` has its types and paths).

A checkpoint for step ``k`` is the state *before* step ``k`` runs: model and optimizer tensors (safetensors), optimizer
scalars, every RNG state, the data cursor, and the ``state_dict`` of any other stateful object the training names (an LR
scheduler, a sampler): their tensors in safetensors, the rest in msgpack. Every tensor's fingerprint is stored beside it
and checked on load, so a checkpoint damaged on disk or in transit is refused rather than silently replayed. No pickle
anywhere. Model tensors are named as the model is written, without a wrapper's ``module.`` or ``_orig_mod.``
(`tracer.sites.module_path`), so a DDP run's checkpoint restores into the model unwrapped and back; one written with
those prefixes still restores into the wrapped model.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

from tracer.checkpoint.interface import STEP_DIR, Checkpoint, Stateful, checkpoint_dir
from tracer.checkpoint.logged_parameters import LoggedParameters, check_logged, logged_parameters
from tracer.checkpoint.manifest_bounds import decode_manifest, read_manifest, tensor_count
from tracer.checkpoint.state import join_tensors, rng_problem, rng_state, split_tensors
from tracer.errors import CaptureError, LogError
from tracer.fingerprint import fingerprint
from tracer.log.layout import CHECKPOINT_DIR
from tracer.log.records import MAX_DEPTH, MAX_STEP, MAX_WORLD_SIZE, nesting_depth_over
from tracer.regular_files import read_regular
from tracer.sites import module_path, wrappers


def list_checkpoints(run_dir: str | Path, rank: int = 0) -> list[int]:
    """Steps that have a complete checkpoint for ``rank``, ascending."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    steps = []
    for d in root.iterdir():
        m = STEP_DIR.match(d.name)
        if m and (d / f"rank-{rank:05d}.msgpack").is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    data: dict[str, Any],
    states: Mapping[str, Stateful] | None = None,
) -> Path:
    """Write the state before ``step``; the manifest is renamed into place last."""
    d = checkpoint_dir(run_dir, step)
    d.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    top = wrappers(model)  # saved under the names of the model as written: a wrapped and an unwrapped run's agree
    for name, t in model.state_dict().items():
        tensors[f"model/{module_path(name, top)}"] = t.detach().to("cpu", copy=True).contiguous()
    optim_meta: dict[str, Any] | None = None
    if optimizer is not None:
        sd = optimizer.state_dict()
        state_meta: dict[str, dict[str, Any]] = {}
        for pid, entries in sd["state"].items():
            plain = {}
            for key, val in entries.items():
                if isinstance(val, torch.Tensor):
                    tensors[f"optim/{pid}/{key}"] = val.detach().to("cpu", copy=True).contiguous()
                else:
                    plain[key] = val
            state_meta[str(pid)] = plain
        optim_meta = {"param_groups": sd["param_groups"], "state": state_meta}
    rng, rng_tensors = rng_state()
    tensors.update(rng_tensors)
    plain_states = {}
    for name, obj in (states or {}).items():
        plain_states[name] = split_tensors(obj.state_dict(), f"state/{name}", tensors)
    manifest = {
        "step": step,
        "rank": rank,
        "fingerprints": {k: f"{fingerprint(v):016x}" for k, v in tensors.items()},
        "optimizer": optim_meta,
        "rng": rng,
        "data": data,
        "states": plain_states,
    }
    base = d / f"rank-{rank:05d}"
    tmp_st, tmp_mp = base.with_suffix(".safetensors.tmp"), base.with_suffix(".msgpack.tmp")
    try:
        save_file(tensors, str(tmp_st))
        os.replace(tmp_st, base.with_suffix(".safetensors"))
        tmp_mp.write_bytes(msgpack.packb(manifest, use_bin_type=True))
        os.replace(tmp_mp, base.with_suffix(".msgpack"))
    except (OSError, SafetensorError) as exc:
        # Nothing half-written stays: without its manifest (renamed in last) the tensors are no checkpoint.
        for path in (tmp_st, tmp_mp, base.with_suffix(".safetensors")):
            path.unlink(missing_ok=True)
        if not any(d.iterdir()):
            d.rmdir()
        raise CaptureError(
            f"{d}: cannot write the checkpoint of step {step} ({exc}); free space on that "
            "file system or record somewhere else"
        ) from exc
    return d


def load_checkpoint(run_dir: str | Path, step: int, rank: int = 0) -> Checkpoint:
    """Read and verify the checkpoint of ``step``, against its manifest and the parameter fingerprints the run's log
    recorded before that step (`tracer.checkpoint.logged_parameters`); errors name the file and what to do."""
    base = checkpoint_dir(run_dir, step) / f"rank-{rank:05d}"
    mp, st = base.with_suffix(".msgpack"), base.with_suffix(".safetensors")
    if not os.path.lexists(mp) or not os.path.lexists(st):
        have = list_checkpoints(run_dir, rank)
        raise LogError(
            f"{base}: no complete checkpoint for step {step}, rank {rank} "
            f"(checkpoints at steps {have or 'none'}; record with a smaller checkpoint interval)"
        )
    manifest = read_manifest(mp, tensor_count([st]))
    tensors = read_regular(st, "checkpoint tensors")
    ckpt = decode_checkpoint(manifest, tensors, str(base), logged_parameters(run_dir, rank, step))
    if ckpt.step != step:
        raise LogError(
            f"{mp}: checkpoint manifest field 'step' is {ckpt.step}, but the file is that of step {step}: "
            "a checkpoint was copied into the wrong folder; record it again"
        )
    return ckpt


def decode_checkpoint(
    manifest_bytes: bytes, tensor_bytes: bytes, source: str, logged: LoggedParameters | None = None
) -> Checkpoint:
    """Verify and decode a checkpoint from its two files' bytes (`source` names it in errors): every tensor against
    its manifest, the model's also against ``logged``, what the log recorded (`CheckpointChangedError`)."""
    manifest = decode_manifest(manifest_bytes, source)
    try:
        tensors = load(tensor_bytes)
    except (ValueError, TypeError, SafetensorError) as exc:
        raise LogError(f"{source}: unreadable checkpoint ({str(exc) or type(exc).__name__})") from None
    problem = _manifest_problem(manifest)
    if problem:
        raise LogError(f"{source}: checkpoint manifest field {problem}: the checkpoint is damaged; record it again")
    expected = manifest["fingerprints"]
    if set(expected) != set(tensors):
        raise LogError(f"{source}: tensors do not match the manifest (an incomplete copy?)")
    for key, t in tensors.items():
        if f"{fingerprint(t):016x}" != expected[key]:
            raise LogError(f"{source}: tensor {key!r} does not match its recorded fingerprint (corrupted on disk)")
    check_logged(source, manifest["step"], expected, logged)
    model = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    optimizer = None
    if manifest.get("optimizer") is not None:
        meta = manifest["optimizer"]
        state: dict[int, dict[str, Any]] = {int(pid): dict(vals) for pid, vals in meta["state"].items()}
        for k, v in tensors.items():
            if k.startswith("optim/"):
                _, pid, key = (k + "//").split("/", 2)
                if not pid.isdigit() or len(pid) > 10 or not key.strip("/"):
                    raise LogError(f"{source}: checkpoint tensor {k!r:.80} must be named optim/<parameter id>/<key>")
                state.setdefault(int(pid), {})[key.removesuffix("//")] = v
        optimizer = {"state": state, "param_groups": meta["param_groups"]}
    rng = dict(manifest["rng"])
    rng["torch"] = tensors.get("rng/torch")
    rng["cuda"] = [tensors[k] for k in sorted(tensors) if k.startswith("rng/cuda/")]
    states = {name: join_tensors(plain, tensors) for name, plain in manifest.get("states", {}).items()}
    return Checkpoint(
        step=manifest["step"], model=model, optimizer=optimizer, rng=rng, data=manifest["data"], states=states
    )


_MANIFEST_KEYS = ("step", "rank", "fingerprints", "optimizer", "rng", "data", "states")


def _manifest_problem(m: Any) -> str | None:
    """What is missing, ill-typed or out of range in a decoded manifest; None if it has the shape save_checkpoint
    writes. Checked before any value is used."""
    if not isinstance(m, dict):
        return f"(the whole manifest) must be a map, found {type(m).__name__}"
    missing = [k for k in _MANIFEST_KEYS if k not in m]
    if missing:
        return f"{missing[0]!r} is missing"
    step, rank = m["step"], m["rank"]
    if not (type(step) is int and 0 <= step <= MAX_STEP):
        return f"'step' must be an int in 0..{MAX_STEP}, found {step!r:.80}"
    if not (type(rank) is int and 0 <= rank < MAX_WORLD_SIZE):
        return f"'rank' must be an int in 0..{MAX_WORLD_SIZE - 1}, found {rank!r:.80}"
    fps = m["fingerprints"]
    if not (
        isinstance(fps, dict)
        and all(isinstance(k, str) and isinstance(v, str) and _HEX16.fullmatch(v) for k, v in fps.items())
    ):
        return f"'fingerprints' must map tensor name to 16 hex digits, found {fps!r:.80}"
    for name in ("data", "states"):
        if not isinstance(m[name], dict) or nesting_depth_over(m[name]):
            return f"{name!r} must be a map nested at most {MAX_DEPTH} deep, found {type(m[name]).__name__}"
    problem = rng_problem(m["rng"])
    if problem:
        return problem
    return _optimizer_problem(m["optimizer"])


def _optimizer_problem(opt: Any) -> str | None:
    if opt is None:
        return None
    if not (isinstance(opt, dict) and isinstance(opt.get("param_groups"), list) and isinstance(opt.get("state"), dict)):
        return f"'optimizer' must be nil or {{param_groups: list, state: map}}, found {opt!r:.80}"
    for i, group in enumerate(opt["param_groups"]):
        if not isinstance(group, dict) or nesting_depth_over(group):
            return f"'optimizer.param_groups[{i}]' must be a map, found {type(group).__name__}"
        lr = group.get("lr")
        if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr >= 0):
            return f"'optimizer.param_groups[{i}].lr' must be a finite number >= 0, found {lr!r:.80}"
        params = group.get("params")
        if not (isinstance(params, list) and all(type(p) is int and 0 <= p < 1 << 32 for p in params)):
            return f"'optimizer.param_groups[{i}].params' must be a list of parameter ids, found {params!r:.80}"
    for pid, vals in opt["state"].items():
        if not (isinstance(pid, str) and pid.isdigit() and len(pid) <= 10 and isinstance(vals, dict)):
            return f"'optimizer.state' must map parameter id (digits) to a map, found {pid!r:.40}: {vals!r:.40}"
        if nesting_depth_over(vals):
            return f"'optimizer.state.{pid}' must be a map nested at most {MAX_DEPTH} deep"
    return None


_HEX16 = re.compile(r"[0-9a-f]{16}")
