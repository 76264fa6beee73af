"""DCP storage without pickle: a writer that fingerprints every shard it writes, a reader that verifies them.

``torch.distributed.checkpoint`` plans which rank writes which shard; these two classes are where the bytes
go. `ShardWriter` writes each rank's shards as one safetensors file (``__<rank>_0.distcp``, DCP's
``SerializationFormat.SAFETENSORS``), records each shard's file, offsets and fingerprint, and writes no
``.metadata`` (DCP's index is a pickle). `VerifyingReader` builds DCP's ``Metadata`` from every rank's
manifest (`tracer.checkpoint.dcp_manifest`), reads the safetensors files (never ``torch.load``), and fingerprints each
shard before any of it is copied into the model: a mismatch is a `LogError` naming the file, the tensor and
both fingerprints. A model shard is also checked against the PARAM fingerprint its writer's log recorded
before the checkpoint's step (`tracer.checkpoint.logged_parameters`; ``logged(rank)``, read once per writer)::

    writer = ShardWriter(folder)
    dcp.save(flat, storage_writer=writer)          # writer.shards: name -> ShardRecord
    dcp.load(flat, storage_reader=VerifyingReader(folder, manifests, names, logged))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load
from torch.distributed.checkpoint import FileSystemWriter, LoadPlan, LoadPlanner, SavePlan, SavePlanner, StorageReader
from torch.distributed.checkpoint.filesystem import SerializationFormat
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItemType
from torch.futures import Future

from tracer.checkpoint.dcp_manifest import DcpManifest, ShardRecord
from tracer.checkpoint.logged_parameters import LoggedParameters, check_logged
from tracer.errors import LogError
from tracer.fingerprint import fingerprint
from tracer.regular_files import read_regular


class ShardWriter(FileSystemWriter):
    """DCP's file-system writer in safetensors form, remembering the fingerprint of every shard it writes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(
            path,
            single_file_per_rank=True,
            sync_files=True,
            thread_count=1,
            overwrite=True,
            serialization_format=SerializationFormat.SAFETENSORS,
        )
        self.shards: dict[str, ShardRecord] = {}

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[Any]:
        prints, sizes = {}, {}
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                raise LogError(
                    f"{item.index.fqn!r}: a sharded checkpoint stores tensors only (DCP pickles other "
                    "objects); sdctrace keeps the rest in its manifest"
                )
            data, chunk = planner.resolve_data(item), item.tensor_data
            assert isinstance(data, torch.Tensor) and chunk is not None, f"{item.index.fqn!r}: not a tensor item"
            prints[item.index.fqn] = f"{fingerprint(data):016x}"
            sizes[item.index.fqn] = tuple(chunk.chunk.sizes)
        future = super().write_data(plan, planner)
        for result in future.value():
            index, info = result.index, result.storage_data
            assert index.offset is not None, f"{index.fqn!r}: a tensor's shard has an offset"
            self.shards[index.fqn] = ShardRecord(
                info.relative_path, tuple(index.offset), sizes[index.fqn], prints[index.fqn]
            )
        return future

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        """Nothing: DCP's ``.metadata`` is a pickle; each rank's manifest takes its place."""


class VerifyingReader(StorageReader):
    """Reads what `ShardWriter` wrote, with DCP's metadata built from the manifests of all ranks."""

    def __init__(
        self,
        folder: Path,
        manifests: Sequence[DcpManifest],
        manifest_names: Sequence[str],
        logged: Callable[[int], LoggedParameters | None] = lambda rank: None,
    ) -> None:
        super().__init__()
        self.folder = Path(folder)
        # (name, offsets) -> (shard, the manifest file that recorded it, the rank that wrote it)
        self.index: dict[tuple[str, tuple[int, ...]], tuple[ShardRecord, str, int]] = {}
        self.metadata: dict[str, TensorStorageMetadata] = {}
        self.step = manifests[0].step if manifests else 0
        self._logged = logged
        self._logs: dict[int, LoggedParameters | None] = {}  # writer rank -> what its log recorded, read once
        for manifest, source in zip(manifests, manifest_names, strict=True):
            for name, shard in manifest.shards.items():
                self.index[(name, shard.offsets)] = (shard, source, manifest.rank)
                layout = manifest.layout.get(name)
                if layout is None:
                    raise LogError(f"{source}: shard {name!r} has no layout entry; the checkpoint is damaged")
                md = self.metadata.setdefault(
                    name,
                    TensorStorageMetadata(
                        TensorProperties(dtype=getattr(torch, layout.dtype)), torch.Size(layout.shape), []
                    ),
                )
                md.chunks.append(ChunkStorageMetadata(torch.Size(shard.offsets), torch.Size(shard.sizes)))
        self._files: dict[str, dict[str, torch.Tensor]] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._files = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return Metadata(state_dict_metadata=dict(self.metadata))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            name, offsets = req.storage_index.fqn, tuple(req.storage_index.offset or ())
            shard, source, writer = self.index[(name, offsets)]
            stored = self.verified(name, shard, source)
            if writer not in self._logs:
                self._logs[writer] = self._logged(writer)
            check_logged(str(self.folder / shard.file), self.step, {name: shard.fingerprint}, self._logs[writer])
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                stored = stored.narrow(dim, start, length)
            target = planner.resolve_tensor(req).detach()
            if target.size() != stored.size():
                raise LogError(
                    f"{self.folder / shard.file}: tensor {name!r} has a slice of {tuple(stored.shape)}, "
                    f"this run's is {tuple(target.shape)}; the checkpoint is damaged"
                )
            target.copy_(stored)
            planner.commit_tensor(req, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def verified(self, name: str, shard: ShardRecord, source: str) -> torch.Tensor:
        """The shard as read from its file, after its fingerprint matched the manifest's."""
        path = self.folder / shard.file
        if shard.file not in self._files:
            try:
                self._files[shard.file] = load(read_regular(path, "checkpoint shards"))
            except (SafetensorError, ValueError) as exc:
                raise LogError(f"{path}: unreadable checkpoint shards ({exc}); record the checkpoint again") from None
        stored = self._files[shard.file].get(name)
        if stored is None:
            raise LogError(f"{path}: holds no tensor {name!r}, which {source} says it wrote (an incomplete copy?)")
        found = f"{fingerprint(stored):016x}"
        if found != shard.fingerprint or tuple(stored.shape) != shard.sizes:
            raise LogError(
                f"{path}: tensor {name!r} has fingerprint {found}, {source} recorded {shard.fingerprint} "
                "(corrupted on disk or in transit); restore another checkpoint or record it again"
            )
        return stored

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False
