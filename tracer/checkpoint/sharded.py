"""Sharded checkpoints of FSDP2 / DTensor training through ``torch.distributed.checkpoint``, verified on load.

Every rank calls both, with the model (and optimizer) it trains; the state is that before ``step`` runs::

    from tracer.checkpoint.sharded import load_sharded_checkpoint, save_sharded_checkpoint
    save_sharded_checkpoint(run_dir, step, model, optimizer, data={"step": step}, states={"sched": sched})
    restored = load_sharded_checkpoint(run_dir, step, model, optimizer, states={"sched": sched})
    restored.data  # the data cursor saved with it

The model and optimizer state come from ``torch.distributed.checkpoint.state_dict`` (FSDP2 parameters and
optimizer states are DTensors: each rank writes its own shards; a replicated tensor is written once) and go
through ``dcp.save`` / ``dcp.load`` with `tracer.checkpoint.dcp_storage`'s writer and reader: safetensors files, no
pickle written or read (DCP's ``.metadata`` is never written). Each rank's RNG states and the other states'
tensors go in under the rank's own names; everything that is not a tensor is in the rank's manifest
(`tracer.checkpoint.dcp_manifest`), with the fingerprint of every shard the rank wrote and the layout (global shape,
mesh, placements) of every tensor it holds.

On load, each shard is fingerprinted before it is used, and a model shard is checked against the parameter
fingerprint its writer's log recorded before ``step`` (`tracer.checkpoint.logged_parameters`). A checkpoint written
by another world size, or with another mesh or placements for any tensor, is refused in one line naming the fix:
sdctrace does not reshard.

    <run>/checkpoints/step-000010/dcp/__0_0.distcp        rank 0's shards (safetensors)
    <run>/checkpoints/step-000010/dcp/rank-00000.msgpack  rank 0's manifest (renamed into place last)
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from tracer.checkpoint.dcp_manifest import DcpManifest, TensorLayout, list_sharded_checkpoints, parse_manifest
from tracer.checkpoint.dcp_storage import ShardWriter, VerifyingReader
from tracer.checkpoint.interface import RestoredCheckpoint, Stateful, manifest_name, sharded_checkpoint_dir
from tracer.checkpoint.logged_parameters import logged_parameters
from tracer.checkpoint.manifest_bounds import read_manifest, tensor_count
from tracer.checkpoint.state import join_tensors, rng_state, set_rng_state, split_tensors
from tracer.errors import CaptureError, LogError, SdcError


def save_sharded_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    data: Mapping[str, Any],
    states: Mapping[str, Stateful] | None = None,
) -> Path:
    """Write this rank's part of the state before ``step`` (a collective: every rank calls it)."""
    rank, world = _rank_and_world()
    folder = sharded_checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {f"model/{k}": v for k, v in _model_state(model).items()}
    optim_plain = None
    if optimizer is not None:
        with _no_state_created(optimizer) as fresh:
            osd: dict[str, Any] = get_optimizer_state_dict(model, optimizer)  # torch types its values loosely
        plain: dict[str, dict[str, Any]] = {}
        for fqn, entries in ({} if fresh else osd["state"]).items():
            for key, val in entries.items():
                if isinstance(val, torch.Tensor):
                    flat[f"optim/{fqn}/{key}"] = val
                else:
                    plain.setdefault(fqn, {})[key] = val
        optim_plain = {"param_groups": osd["param_groups"], "state": plain}
    own = _own_prefix(rank)
    rng, own_tensors = rng_state()
    plain_states = {
        name: split_tensors(obj.state_dict(), f"state/{name}", own_tensors) for name, obj in (states or {}).items()
    }
    flat.update({own + k: v for k, v in own_tensors.items()})
    writer = ShardWriter(folder)
    try:
        with _single_process_quietly():
            dcp.save(flat, storage_writer=writer, no_dist=not dist.is_initialized())
    except CheckpointException as exc:
        _raise_first(exc, f"{folder}: cannot write the checkpoint of step {step}")
    except OSError as exc:
        raise CaptureError(
            f"{folder}: cannot write the checkpoint of step {step} ({exc}); free space on that "
            "file system or record somewhere else"
        ) from exc
    manifest = DcpManifest(
        step,
        rank,
        world,
        {k: TensorLayout.of(v) for k, v in flat.items()},
        writer.shards,
        optim_plain,
        rng,
        dict(data),
        plain_states,
    )
    try:
        encoded = manifest.encode()
    except (TypeError, ValueError) as exc:
        raise LogError(
            f"checkpoint of step {step}: cannot store the optimizer's param_groups or the data cursor "
            f"without pickle ({exc}); keep them to numbers, strings, lists and dicts"
        ) from None
    path = folder / manifest_name(rank)
    tmp = path.with_suffix(".msgpack.tmp")
    tmp.write_bytes(encoded)
    os.replace(tmp, path)
    return folder


def load_sharded_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    states: Mapping[str, Stateful] | None = None,
) -> RestoredCheckpoint:
    """Restore this rank's model, optimizer, named states and RNG from the checkpoint of ``step`` (a collective)."""
    rank, world = _rank_and_world()
    folder = sharded_checkpoint_dir(run_dir, step)
    first = _read_manifest(run_dir, step, 0)
    if first.world_size != world:
        raise LogError(
            f"{folder}: the checkpoint of step {step} was written by {first.world_size} ranks, this run "
            f"has {world}: resume it with {first.world_size} ranks (--nproc {first.world_size}); "
            "sdctrace does not reshard checkpoints"
        )
    manifests = [first] + [_read_manifest(run_dir, step, r) for r in range(1, world)]
    mine = manifests[rank]
    model_sd = _model_state(model)
    flat = {f"model/{k}": v for k, v in model_sd.items()}
    saved_fresh = not any(k.startswith("optim/") for k in mine.layout)  # saved before the optimizer's first step
    osd: dict[str, Any] | None = None  # as in save: {"state": {fqn: {key: value}}, "param_groups": ...}
    if optimizer is not None:
        with _no_state_created(optimizer):
            osd = get_optimizer_state_dict(model, optimizer)
    if osd is not None and not saved_fresh:
        flat.update(
            {
                f"optim/{fqn}/{key}": val
                for fqn, entries in osd["state"].items()
                for key, val in entries.items()
                if isinstance(val, torch.Tensor)
            }
        )
    own = _own_prefix(rank)
    own_tensors = {
        k: torch.empty(v.shape, dtype=getattr(torch, v.dtype)) for k, v in mine.layout.items() if k.startswith(own)
    }
    flat.update(own_tensors)
    _check_layout(folder / manifest_name(rank), step, mine, flat)
    try:
        reader = VerifyingReader(
            folder,
            manifests,
            [str(folder / manifest_name(r)) for r in range(world)],
            lambda writer: logged_parameters(run_dir, writer, step),
        )
        with _single_process_quietly():
            dcp.load(flat, storage_reader=reader, no_dist=not dist.is_initialized())
    except CheckpointException as exc:
        _raise_first(exc, f"{folder}: cannot read the checkpoint of step {step}")
    set_model_state_dict(model, dict(model_sd))  # a dict of torch's looser value type
    if optimizer is not None and osd is not None:
        if mine.optimizer is None:
            raise LogError(
                f"{folder / manifest_name(rank)}: the checkpoint of step {step} holds no optimizer state; "
                "was it saved without the optimizer?"
            )
        plain = mine.optimizer["state"]
        state: dict[str, Any] = (
            {}
            if saved_fresh
            else {
                fqn: {**plain.get(fqn, {}), **{k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}}
                for fqn, entries in osd["state"].items()
            }
        )
        with _no_state_created(optimizer) if saved_fresh else contextlib.nullcontext():
            set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": mine.optimizer["param_groups"]})
    tensors = {k.removeprefix(own): v for k, v in own_tensors.items()}
    for name, obj in (states or {}).items():
        if name not in mine.states:
            raise LogError(
                f"checkpoint of step {step} holds no state for {name!r} "
                f"(it has {sorted(mine.states) or 'none'}); was the run recorded with it?"
            )
        obj.load_state_dict(join_tensors(mine.states[name], tensors))
    rng = dict(mine.rng)
    rng["torch"] = tensors.get("rng/torch")
    rng["cuda"] = [tensors[k] for k in sorted(tensors) if k.startswith("rng/cuda/")]
    set_rng_state(rng)
    return RestoredCheckpoint(step, first.world_size, dict(mine.data))


@contextlib.contextmanager
def _no_state_created(optimizer: torch.optim.Optimizer) -> Iterator[bool]:
    """DCP's optimizer state dicts create a stateless optimizer's state by stepping it once at lr 0 (AdamW: step 1
    and zero moments), which would change every later step's bits: state the call created is dropped again, so
    a checkpoint taken (or restored) before the first step leaves the optimizer as a run without it has it.
    Yields whether the optimizer had no state."""
    fresh = not optimizer.state
    try:
        yield fresh
    finally:
        if fresh:
            optimizer.state.clear()


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def _single_process_quietly() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: that is what the caller meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _own_prefix(rank: int) -> str:
    """Names of a rank's own tensors (RNG, other states): no other rank holds them."""
    return f"rank-{rank:05d}/"


def _model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    sd = get_model_state_dict(model)
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise LogError(
                f"model state {k!r} is a {type(v).__name__}: a sharded checkpoint stores the model's tensors only"
            )
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}  # every one, as checked


def _read_manifest(run_dir: str | Path, step: int, rank: int) -> DcpManifest:
    path = sharded_checkpoint_dir(run_dir, step) / manifest_name(rank)
    if not os.path.lexists(path):
        have = list_sharded_checkpoints(run_dir)
        raise LogError(
            f"{path}: no complete sharded checkpoint for step {step}, rank {rank} "
            f"(sharded checkpoints at steps {have or 'none'}; record with a smaller checkpoint interval)"
        )
    shards = sorted(p for p in path.parent.iterdir() if p.suffix == ".distcp") if path.parent.is_dir() else []
    manifest = parse_manifest(read_manifest(path, tensor_count(shards)), str(path))
    if (manifest.step, manifest.rank) != (step, rank):
        raise LogError(
            f"{path}: the manifest is that of step {manifest.step}, rank {manifest.rank}: a checkpoint "
            "was copied into the wrong folder; record it again"
        )
    return manifest


def _check_layout(source: Path, step: int, mine: DcpManifest, flat: Mapping[str, torch.Tensor]) -> None:
    """Refuse, in one line, a checkpoint whose tensors are not this run's: other names, shapes, mesh, placements."""
    missing = sorted(set(flat) - set(mine.layout))
    extra = sorted(set(mine.layout) - set(flat))
    if missing or extra:
        what = f"holds no {missing[0]!r}" if missing else f"holds {extra[0]!r}, which this run has not"
        raise LogError(
            f"{source}: the checkpoint of step {step} {what} ({len(missing)} missing, {len(extra)} "
            "extra): restore it into the model and optimizer it was saved from"
        )
    for name, t in flat.items():
        diffs = mine.layout[name].differences(TensorLayout.of(t))
        if diffs:
            raise LogError(
                f"{source}: tensor {name!r} of the checkpoint of step {step}: {'; '.join(diffs)}: resume "
                "on the mesh and placements it was saved with; sdctrace does not reshard checkpoints"
            )


def _raise_first(exc: CheckpointException, context: str) -> NoReturn:
    """DCP gathers every rank's failure; raise the first rank's as itself (an `SdcError` stays one line)."""
    for rank in sorted(exc.failures):
        failure = exc.failures[rank]
        err = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(err, SdcError):
            raise err.with_traceback(None) from None
    first = exc.failures[min(exc.failures)] if exc.failures else None
    cause = first[0] if isinstance(first, tuple) else first
    raise CaptureError(
        f"{context}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    ) from None
