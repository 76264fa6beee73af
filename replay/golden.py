"""The golden side of a replay: what the healthy run recorded, and a checker for re-execution.

A replay never trusts that re-running a step on this machine gives the golden
bits: every re-executed fingerprint is compared with the golden log (`VerifyingSink`), and
each disagreement is a `GoldenMismatch` (logged as a ``replay_divergence`` event). The
golden re-execution runs under a `KeepingTracer`, which also keeps the tensors the
suspect is compared with; `workload_entry` names the factory that rebuilds the run.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tracer.checkpoint import list_step_checkpoints
from tracer.errors import ConfigError, LogError, ValidationError
from tracer.fingerprint import TensorDigest
from tracer.intercept import own_ops
from tracer.log import LogReader, list_ranks, rank_dir
from tracer.log.records import EventRecord, Phase, RunHeader, TensorRecord, describe_microbatch
from tracer.options import TraceOptions
from tracer.sites import sites_named
from tracer.tracing import Tracer
from workload.protocol import REFERENCE
from workload.reference_config import Config

Key = tuple[int, int, str, Phase]  # step, microbatch, name, phase


def index_key(step: int, microbatch: int, name: str, phase: Phase) -> Key:
    """A record's key in replay's indexes. A step has one gradient and one parameter record of each name, so their
    microbatch is left out: a log of schema 1 labels every gradient 0, a later one the microbatch whose backward
    last changed it."""
    return (step, 0 if phase in (Phase.GRAD, Phase.PARAM) else microbatch, name, phase)


def check_rank_logs(path: Path, world_size: int) -> None:
    """Refuse a golden run that does not hold exactly the logs rank-00000 .. of its header's ``world_size``."""
    ranks = list_ranks(path)
    if ranks != list(range(len(ranks))) or len(ranks) != world_size:  # never list range(world_size): it is read
        held = f"ranks {ranks[:8]}".replace("]", ", ...]" if len(ranks) > 8 else "]")
        raise ValidationError(
            f"{path}: holds the logs of {held}, but its header's world_size is {world_size}; "
            "replay needs every rank's log, rank-00000 to the last: copy the missing rank-NNNNN folders"
        )


@dataclass
class GoldenRun:
    """A recorded healthy run, indexed for the steps a replay needs."""

    path: Path
    header: RunHeader
    checkpoints: list[int]
    last_step: int
    rank: int = 0
    start_checkpoint: int = 0  # the checkpoint reconstruction starts from
    expected: dict[Key, int] = field(default_factory=dict)  # fingerprints of the indexed steps
    metas: dict[Key, str] = field(default_factory=dict)  # their dtypes and shapes, e.g. "bfloat16[2,16,32]"
    rng: dict[int, dict[str, Any]] = field(default_factory=dict)  # `rng` events (tracer/rng.py) by step
    logs_rng: bool = False  # the log has `rng` events (recorded by a Tracer that writes them)
    blobs: dict[Key, int] = field(default_factory=dict)  # captured full tensors
    losses: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # `loss` events by step: (mb, loss)
    sites: list[str] = field(default_factory=list)  # forward sites in recording order

    @classmethod
    def open(cls, path: str | Path, start: int, stop: int, rank: int = 0) -> GoldenRun:
        """Index ``rank`` from the latest checkpoint at or before ``start`` up to ``stop`` (exclusive)."""
        path = Path(path)
        if not path.is_dir():
            raise LogError(f"{path}: not a run directory; pass the golden run made by `sdc record`")
        reader = LogReader(rank_dir(path, rank))
        header = reader.header
        check_rank_logs(path, header.world_size)
        if header.role != "train":
            raise ValidationError(f"{path}: is a {header.role!r} log; the golden side must be a recorded training run")
        if header.device.startswith("xla"):
            raise ValidationError(
                f"{path}: recorded on {header.device}; replay re-executes on the CPU, whose arithmetic is not XLA's, "
                "so it cannot rebuild this run (docs/xla.md)"
            )
        run = cls(path, header, list_step_checkpoints(path, rank), last_step=-1, rank=rank)
        first = run.start_checkpoint = run.checkpoint_before(start)
        seen_sites: dict[str, None] = {}
        for rec in reader.records():
            if isinstance(rec, TensorRecord):
                run.last_step = max(run.last_step, rec.step)
                if rec.phase == Phase.FORWARD:
                    seen_sites.setdefault(rec.name)
                if first <= rec.step < stop:
                    key = index_key(rec.step, rec.microbatch, rec.name, Phase(rec.phase))
                    run.expected[key], run.metas[key] = rec.fingerprint, rec.meta
            elif isinstance(rec, EventRecord) and rec.kind == "rng":
                run.logs_rng = True
                if first <= rec.step < stop:
                    run.rng[rec.step] = _rng_fields(path, rec)
            elif isinstance(rec, EventRecord) and rec.kind == "loss" and first <= rec.step < stop:
                run.losses.setdefault(rec.step, []).append((rec.fields["microbatch"], rec.fields["loss"]))
            elif isinstance(rec, EventRecord) and rec.kind == "blob" and first <= rec.step < stop:
                f = rec.fields
                run.blobs[index_key(rec.step, f["microbatch"], f["name"], Phase(f["phase"]))] = f["fingerprint"]
        # The header names the traced modules; records also hold collectives, which are no lockstep sites.
        run.sites = list(header.extra.get("sites", seen_sites))
        return run

    @property
    def site_names(self) -> tuple[str, ...]:
        """The traced modules, as the recording's Tracer matched them: the sites without an expert's ``[N]``."""
        return tuple(dict.fromkeys(re.sub(r"\[.*\]$", "", s) for s in self.sites))

    def site_options(self, model: nn.Module) -> TraceOptions:
        """Trace options for a re-execution on ``model`` at the recording's sites, looked up by name (no pattern);
        the defaults where the log names none."""
        return TraceOptions(sites=tuple(m for _, m in sites_named(model, self.site_names)) if self.sites else None)

    def checkpoint_before(self, step: int) -> int:
        """The latest checkpoint at or before ``step``; an error says which exist."""
        usable = [c for c in self.checkpoints if c <= step]
        if not usable:
            raise ValidationError(
                f"{self.path}: no checkpoint at or before step {step} (checkpoints at {self.checkpoints or 'none'}); "
                "record the golden run with --checkpoint-every so replay can rebuild that state"
            )
        return usable[-1]


def workload_entry(golden: GoldenRun, named: str | None) -> str:
    """The factory that rebuilds ``golden``: the one the user named, or the reference workload when the
    run says it was recorded with it. A run's header never makes replay import code by itself."""
    recorded = golden.header.extra.get("workload")
    if named is not None:
        if recorded is not None and recorded != named:
            print(
                f"note: {golden.path} was recorded with --workload {recorded}; replaying with {named}", file=sys.stderr
            )
        return named
    if recorded == REFERENCE or (recorded is None and _is_reference_config(golden.header.config)):
        return REFERENCE
    if recorded is not None:
        raise ConfigError(
            f"{golden.path}: was recorded with workload {recorded!r}; replay imports only code you "
            f"name, so pass --workload {recorded} if you trust it"
        )
    raise ConfigError(
        f"{golden.path}: was recorded by a training loop of your own; pass --workload "
        "package.module:factory naming a factory that rebuilds it (docs/own-training.md)"
    )


def _is_reference_config(config: dict[str, Any]) -> bool:
    try:
        Config.from_dict(config)
    except ConfigError:
        return False
    return True


def _rng_fields(path: Path, rec: EventRecord) -> dict[str, Any]:
    f = rec.fields
    fp, devices, stored = f.get("fingerprint"), f.get("devices"), f.get("stored")
    if not (
        type(fp) is int
        and 0 <= fp < 1 << 64
        and type(devices) is int
        and 0 <= devices < 1 << 16
        and type(stored) is bool
    ):
        raise LogError(
            f"{path}: the rng event of step {rec.step} must hold fingerprint (uint64), devices (int) and "
            f"stored (bool), found {f!r:.120}; the log is damaged"
        )
    return f


@dataclass(frozen=True)
class GoldenMismatch:
    """A fingerprint of the golden run's re-execution that differs from its log: this machine did not
    reproduce the recording (not a difference between two runs, which is `tracer.compare`'s)."""

    step: int
    microbatch: int
    name: str
    phase: Phase
    expected: int
    found: int
    meta: str = ""  # the re-executed tensor's dtype and shape
    position: int = 0  # how many traced tensors the re-execution had checked up to this one (1 = the first)

    def describe(self) -> str:
        return (
            f"step {self.step}, {describe_microbatch(self.microbatch)}, {self.phase.name.lower()} {self.name}: "
            f"fingerprint {self.found:016x}, the golden log has {self.expected:016x}"
        )


class VerifyingSink:
    """A Tracer sink that checks each re-executed tensor against the golden log."""

    def __init__(self, expected: dict[Key, int], watch: Key | None = None) -> None:
        self.expected = expected
        self.mismatches: list[GoldenMismatch] = []
        self.checked = 0
        self.watch = watch  # a tensor whose position is kept (`watched_at`): what differed before it, what after
        self.watched_at: int | None = None

    def write_tensor(self, rec: TensorRecord) -> None:
        key = index_key(rec.step, rec.microbatch, rec.name, Phase(rec.phase))
        want = self.expected.get(key)
        if want is None:
            return  # the golden run did not trace this tensor
        self.checked += 1
        if key == self.watch:
            self.watched_at = self.checked
        if want != rec.fingerprint:
            self.mismatches.append(
                GoldenMismatch(
                    rec.step, rec.microbatch, rec.name, Phase(rec.phase), want, rec.fingerprint, rec.meta, self.checked
                )
            )

    def write_event(self, rec: EventRecord) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, status: str = "complete", detail: str = "") -> None:
        pass

    def abandon(self) -> None:
        pass


class KeepingTracer(Tracer):
    """The golden re-execution's Tracer, which also keeps the tensors the suspect is compared with: the
    same hooks that recorded the golden run, so re-execution builds the very same autograd graph."""

    _kept: dict[Key, torch.Tensor] | None = None
    _phases: frozenset[Phase] = frozenset()

    def keep(self, kept: dict[Key, torch.Tensor] | None, phases: set[Phase]) -> None:
        self._kept, self._phases = kept, frozenset(phases)
        self._params = self.parameter_names

    def record_many(
        self,
        named: list[tuple[str, torch.Tensor]],
        phase: Phase,
        microbatch: int | None = None,
        *,
        read_now: bool = False,
    ) -> list[TensorDigest] | None:
        digests = super().record_many(named, phase, microbatch, read_now=read_now)
        if self._kept is None or phase not in self._phases:
            return digests
        mb = self.microbatch_index if microbatch is None else microbatch
        with own_ops():
            for name, tensor in named:
                # Collectives record GRAD-phase tensors too; the suspect is compared on parameter gradients only.
                if phase != Phase.GRAD or name in self._params:
                    self._kept[index_key(self.step_index, mb, name, phase)] = tensor.detach().clone()
        return digests
