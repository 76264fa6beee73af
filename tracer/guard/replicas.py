"""Replica agreement: after each optimizer step, the data-parallel replicas of every parameter compare its
fingerprint, and a rank that disagrees with its replicas' majority is named, with the parameter.

    guard = Guard(replicas=ReplicaAgreement())      # pure DDP: all ranks are replicas of each other
    with Tracer(ddp, optimizer, out="runs/a", run=run, guard=guard) as tr: ...

No twin and no replay: each rank already fingerprints its parameters after the step (the PARAM records)
and its gradients before it (the GRAD records, reduced by then under DDP); `ReplicaCheck` sends those 8-byte
fingerprints, and one more of the names they belong to, in one all-gather of a uint64 tensor per step, to
the rank's replica group: under a `tracer.parallel.Layout` with ``tp > 1``, the ranks with its tensor-parallel
coordinate; with a DeviceMesh (HSDP), the group you pass (``ReplicaAgreement(group=mesh.get_group("replicate"))``).
DTensor parameters and gradients are compared only with an explicit group: an FSDP shard has no replica.

Per tensor, a fingerprint held by more than half the replicas is the majority and every rank holding another
is **blamed**; with no majority (two replicas that differ, or a 2-2 split) the step is a **tie**: a
disagreement with nobody blamed, since nothing tells which replica is the healthy one. Any disagreement is
logged as a ``replicas`` event on every rank (`Disagreement.fields`: the `tracer.guard.Alarm` fields and
who), which `pipelines.alarms` scores as detector ``replica_agreement``. The step has already changed the
weights, so no re-run can undo it: the check logs, and training goes on (docs/guard.md).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from tracer.errors import CaptureError
from tracer.fingerprint import TensorDigest
from tracer.guard.detectors import Alarm
from tracer.guard.ranks import group_device
from tracer.intercept import own_ops
from tracer.parallel import Layout

NAMES_SHOWN = 8  # names a detail line lists before "and N more"


@dataclass(frozen=True)
class ReplicaAgreement:
    """Compare every replicated parameter's fingerprint after each optimizer step, and its reduced gradient's
    (``gradients``), across the data-parallel replicas: ``group`` (a ProcessGroup), or the layout's."""

    name: ClassVar[str] = "replica_agreement"
    gradients: bool = True
    group: Any = field(default=None, compare=False)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gradients": self.gradients,
            "group": "given" if self.group is not None else "layout",
        }


@dataclass(frozen=True)
class Disagreement:
    """Tensors whose replicas differ after one step: which ranks are blamed (none on a tie) and which names."""

    step: int
    replicas: tuple[int, ...]  # the group's global ranks
    blamed: tuple[int, ...]
    tie: bool
    parameters: tuple[str, ...]
    gradients: tuple[str, ...]

    def alarm(self) -> Alarm:
        names = [*self.parameters, *(f"{n} (gradient)" for n in self.gradients)]
        said = ", ".join(names[:NAMES_SHOWN]) + (
            f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
        )
        who = (
            f"rank {', '.join(map(str, self.blamed))} disagrees with the majority of replicas {list(self.replicas)}"
            if self.blamed
            else ""
        )
        tie = f"no majority among replicas {list(self.replicas)} (a tie: nobody blamed)" if self.tie else ""
        return Alarm(ReplicaAgreement.name, float(len(names)), 0.0, f"{'; '.join(filter(None, (who, tie)))}: {said}")

    def fields(self) -> dict[str, Any]:
        """The ``replicas`` event's fields."""
        return {
            **self.alarm().to_event(),
            "replicas": list(self.replicas),
            "ranks": list(self.blamed),
            "tie": self.tie,
            "parameters": list(self.parameters),
            "gradients": list(self.gradients),
        }


def disagreement(
    step: int, table: np.ndarray, replicas: Sequence[int], names: Sequence[str], gradients: int
) -> Disagreement | None:
    """From ``table`` (one row per replica, one column per tensor: its fingerprint; the first ``gradients``
    columns are gradients, named like the parameters after them), who disagrees, or None when all agree."""
    blamed: set[int] = set()
    tie = False
    bad: list[int] = []
    for col in np.flatnonzero((table != table[:1]).any(axis=0)).tolist():
        bad.append(col)
        value, count = Counter(table[:, col].tolist()).most_common(1)[0]
        if 2 * count > len(replicas):
            blamed |= {replicas[r] for r in np.flatnonzero(table[:, col] != value).tolist()}
        else:
            tie = True
    if not bad:
        return None
    grads = tuple(names[c] for c in bad if c < gradients)
    params = tuple(names[c] for c in bad if c >= gradients)
    return Disagreement(step, tuple(replicas), tuple(sorted(blamed)), tie, params, grads)


def replica_group(check: ReplicaAgreement, layout: Layout, rank: int) -> tuple[Any, tuple[int, ...]]:
    """This rank's replica group and its global ranks. Every rank calls it, in the same order (a new group is
    made collectively)."""
    if check.group is not None:
        return check.group, tuple(dist.get_process_group_ranks(check.group))
    if layout.tp == 1:
        return None, tuple(range(layout.world_size))
    mine: Any = None
    members: tuple[int, ...] = ()
    for t in range(layout.tp):
        ranks = [t + k * layout.tp for k in range(layout.dp)]
        group = dist.new_group(ranks)
        if rank in ranks:
            mine, members = group, tuple(ranks)
    return mine, members


class ReplicaCheck:
    """One rank's replica agreement: the step's gradient digests, noted before the optimizer step, and the
    comparison after it (`compare`)."""

    def __init__(self, check: ReplicaAgreement, layout: Layout, rank: int) -> None:
        self.check = check
        self.group: Any
        self.replicas: tuple[int, ...]
        self.group, self.replicas = replica_group(check, layout, rank) if layout.world_size > 1 else (None, (rank,))
        self._grads: list[tuple[str, TensorDigest]] = []

    def note_gradients(self, grads: list[tuple[str, TensorDigest]]) -> None:
        """The digests of the gradients the optimizer is about to read (the accepted run's)."""
        self._grads = grads if self.check.gradients else []

    def compare(
        self, step: int, params: list[tuple[str, torch.Tensor]], digests: list[TensorDigest], event: Callable[..., None]
    ) -> None:
        """Gather every replica's fingerprints of this step and log a ``replicas`` event on a disagreement."""
        grads, self._grads = self._grads, []
        if len(self.replicas) < 2:
            return
        skip = set() if self.check.group is not None else {n for n, p in params if _sharded(p)}
        named = [(n, d.fingerprint) for n, d in grads if n not in skip]
        gradients = len(named)
        named += [(n, d.fingerprint) for (n, _), d in zip(params, digests) if n not in skip]
        names = [n for n, _ in named]
        key = hashlib.blake2b("\0".join(names).encode("utf-8") + gradients.to_bytes(8, "little"), digest_size=8)
        row = np.array([int.from_bytes(key.digest(), "little"), *(fp for _, fp in named)], np.uint64)
        table = self._gather(row)
        if (table[:, 0] != row[0]).any():
            raise CaptureError(
                f"step {step}: the replicas {list(self.replicas)} name different parameters or "
                "gradients after the optimizer step; replicas must train the same model (give "
                "ReplicaAgreement(group=...) the data-parallel group)"
            )
        found = disagreement(step, table[:, 1:], self.replicas, names, gradients)
        if found is not None:
            event("replicas", **found.fields())

    def _gather(self, row: np.ndarray) -> np.ndarray:
        with own_ops():
            mine = torch.from_numpy(row.view(np.int64)).to(group_device(self.group))
            out = [torch.empty_like(mine) for _ in self.replicas]
            dist.all_gather(out, mine, group=self.group)  # gloo has no all_gather_into_tensor
            return torch.stack(out).cpu().numpy().view(np.uint64)


def _sharded(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"
