"""The record job: train any workload deterministically under a Tracer into a run directory.

    summary = record(cfg.to_dict(), RecordRequest(out=Path("runs/a"), node_label="node-a"))
    summary = record(config, RecordRequest(out=..., node_label=..., workload="my_pkg.train:build"), nproc=4)

This is what ``sdc record`` and ``sdc verify-determinism`` run. The job claims the run
directory once (`tracer.log.claim`), then records on one rank in this process, or on
``nproc`` ranks launched by `jobs.launch`, which inherit the claim's lock and get the
request as JSON (`record_rank`). The workload comes from the factory the request
names (`workload.protocol`), the reference one by default; with a fault profile or
ABFT the node plays an unhealthy one (`faults.node`), and the header's ``extra``
records both while its pairing fields stay those of the healthy twin.

With ``resume`` a crashed recording goes on: training restarts from the newest
checkpoint that every rank has and that the log reaches (`resume_step`), and each
rank's log is continued, not rewritten (`tracer.log.resume`, the Tracer's ``resume``):
the steps recorded since that checkpoint are recorded again and supersede the first
recording. A recording that failed for lack of space is left the same way, and its one
line says so ("failed at step N; resumable from checkpoint M"). A folder that a kill
during start-up left with sdctrace's claim and no log (`tracer.log.claim.startup_leftover`)
is recorded again from step 0, with ``resume`` or without.

With ``resume_from`` (a checkpoint of another run, typically the one `sdc certify`
names) ``out`` becomes a new run: `jobs.fork` writes that run's history before the checkpoint
into it, and it is resumed from there, on this node, with this request's faults (or none).

With ``sharpness=K`` every checkpoint step also logs a ``sharpness`` event: the top Hessian
eigenvalue of the state the checkpoint holds (`workload.sharpness`, K iterations), computed
with the Tracer paused and outside the fault emulator, so the recorded bits are those of a run
without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from faults import FaultProfile, profile_from_header
from faults.node import emulated_node, node_header
from jobs.fork import ForkPoint, fork_point, fork_run
from jobs.launch import launch
from jobs.machine import check_resources
from tracer.checkpoint import list_step_checkpoints, restore_step_checkpoint
from tracer.device import is_lazy, resolve_device
from tracer.errors import LogError, SdcError, StorageError, UsageError
from tracer.full_disk import full_disk_reason
from tracer.guard import Policy, default_guard
from tracer.intercept import own_ops
from tracer.log import LogReader, RunHeader, claim_out_dir, list_ranks, rank_dir
from tracer.log.claim import reclaim_out_dir, startup_leftover
from tracer.log.resume import log_end
from tracer.log.runlock import RunLock
from tracer.log.sessions import Resumption
from tracer.options import RunInfo, TraceOptions
from tracer.pairing import pairing_differences
from tracer.tracing import Tracer
from workload.protocol import REFERENCE, RunSettings, Workload, build_workload, factory_modules, run_step
from workload.reference_config import Config
from workload.sharpness import sharpness


@dataclass(frozen=True)
class RecordRequest:
    """Everything about one recording but the workload's own config; the same on every rank."""

    out: Path
    node_label: str
    workload: str = REFERENCE  # the factory's entry point, package.module:function
    overwrite: bool = False
    trace: TraceOptions = TraceOptions()  # what the Tracer records: sites, captured tensors, segment size
    progress: bool = True
    fault_profile: FaultProfile | None = None
    fault_seed: int = 0
    abft: bool = False
    device: str = "cpu"  # cpu, cuda[:N] or xla[:N]
    guard: Policy | None = None  # guard every step with the default detectors and this policy (tracer.guard)
    resume: bool = False  # continue the crashed recording in ``out`` (same options as it was started with)
    resume_from: Path | None = None  # a checkpoint of another run: ``out`` is a new run going on from it (jobs.fork)
    sharpness: int = 0  # iterations of a sharpness estimate at every checkpoint (workload.sharpness); 0 = off
    run_id: str | None = None  # the header's run id (None: a fresh random one); a resumed run keeps its own

    def __post_init__(self) -> None:
        if self.sharpness < 0:
            raise UsageError(f"sharpness = {self.sharpness}: give the iterations of the estimate (>= 1), or 0 for none")
        if self.resume and self.overwrite:
            raise UsageError("--resume continues the run in --out and --overwrite replaces it: give one of them")
        if self.resume and self.resume_from is not None:
            raise UsageError(
                "--resume continues the run in --out, --resume-from starts a new one in --out from "
                "another run's checkpoint: give one of them"
            )

    def to_json(self) -> dict[str, Any]:
        """Plain data for the launcher, which hands the request to every rank's process."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "out": str(self.out),
            "resume_from": None if self.resume_from is None else str(self.resume_from),
            "trace": self.trace.to_dict(),
            "fault_profile": self.fault_profile.header(self.fault_seed) if self.fault_profile is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordRequest:
        profile = profile_from_header(data["fault_profile"]) if data["fault_profile"] else None
        trace = TraceOptions.from_dict(data["trace"], source="sdc record")
        resume_from = None if data["resume_from"] is None else Path(data["resume_from"])
        return cls(
            **{**data, "out": Path(data["out"]), "trace": trace, "fault_profile": profile, "resume_from": resume_from}
        )


@dataclass
class RunSummary:
    out: Path
    steps: int
    final_loss: float
    wall_s: float
    losses: list[float]  # of the steps this call ran
    resumed_from: int | None = None  # the checkpoint a resumed recording restarted from

    def to_json(self) -> dict[str, Any]:
        """Plain data for the launcher, which hands rank 0's summary back to the job."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "out": str(self.out)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSummary:
        return cls(**{**data, "out": Path(data["out"])})


def record(
    config: Config | Mapping[str, Any],
    request: RecordRequest,
    *,
    nproc: int = 1,
    rank_timeout: float = 300.0,
    on_step: Callable[[int, float], None] | None = None,
) -> RunSummary:
    """Claim ``request.out``, then train ``config``'s ``run.steps`` steps under a Tracer on ``nproc`` ranks (in this
    process when it is 1), checkpointing every ``run.checkpoint_every``; rank 0's summary. ``rank_timeout`` bounds
    every collective of a multi-rank job; ``on_step`` (one rank only) is told each step's loss."""
    config = config.to_dict() if isinstance(config, Config) else dict(config)
    dev = resolve_device(request.device)
    if is_lazy(dev) and (request.fault_profile is not None or request.abft):
        raise UsageError(
            f"--device {request.device}: the fault emulator and ABFT run on eager devices only (cpu, cuda)"
        )
    if request.sharpness and (nproc > 1 or is_lazy(dev)):
        raise UsageError(
            f"sharpness: runs on single-rank recordings on eager devices only (cpu, cuda), not "
            f"{nproc} rank(s) on {request.device}"
        )
    if on_step is not None and nproc > 1:
        raise UsageError(f"on_step: reports the steps of a recording on one rank, not {nproc}")
    check_resources(config, nproc, f"{request.out} (the config to record)")
    if request.resume and startup_leftover(request.out):  # killed before any log went out: record from step 0
        request = replace(request, resume=False)
    if request.resume:
        _check_resumed_ranks(request.out, nproc)
    fork = fork_point(request.resume_from) if request.resume_from is not None else None
    if fork is not None:
        _check_fork(fork, request.out, nproc)
    # Claimed once, before any rank starts, so a refusal is quick; launched ranks inherit the lock.
    claim = (
        reclaim_out_dir(request.out, role="train")
        if request.resume
        else claim_out_dir(request.out, role="train", overwrite=request.overwrite)
    )
    try:
        return _record_claimed(config, request, claim, fork, nproc, rank_timeout, on_step)
    except Exception as exc:
        resumable = _resumable_after(exc, request.out, nproc)
        if resumable is None:
            raise
        raise resumable from exc


def _record_claimed(
    config: dict[str, Any],
    request: RecordRequest,
    claim: RunLock,
    fork: ForkPoint | None,
    nproc: int,
    rank_timeout: float,
    on_step: Callable[[int, float], None] | None,
) -> RunSummary:
    """Record into the claimed ``request.out`` (forked first from ``fork``), on ``nproc`` ranks."""
    with claim as lock:
        if fork is not None:  # the history before the checkpoint, then resumed as a crashed run is
            fork_run(
                fork,
                request.out,
                node_label=request.node_label,
                workload=request.workload,
                node_extra=node_header(request.fault_profile, request.fault_seed, request.abft),
                segment_bytes=request.trace.segment_bytes,
            )
            request = replace(request, resume=True, resume_from=None, overwrite=False)
        if nproc == 1:
            return _record_rank(config, request, on_step)
        job = {"config": config, "request": request.to_json()}
        ranks = launch(
            "jobs.record:record_rank",
            job,
            nproc,
            timeout_s=rank_timeout,
            lock=lock,
            preload=factory_modules(request.workload),
        )
        return RunSummary.from_json(ranks[0])


def _resumable_after(exc: BaseException, out: Path, world_size: int) -> StorageError | None:
    """A recording (first or resumed) that stopped for lack of space left its logs resumable
    (`tracer.rank_log`): the one line that says where it failed and where a resume starts; None for any
    other failure, or where nothing can be resumed."""
    reason = full_disk_reason(exc)
    if reason is None:
        return None
    try:
        checkpoint = resume_step(out, world_size)
        last = log_end(rank_dir(out, 0)).last_step
    except (SdcError, OSError):
        return None
    failed = 0 if last is None else last + 1
    return StorageError(
        f"{out}: failed at step {failed} ({reason}); resumable from checkpoint {checkpoint}: free space on that "
        "file system (or raise the file-size limit), then give the same sdc record command with --resume"
    )


def record_rank(config: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """One rank of a multi-rank record job: what `jobs.launch` runs in each process (the job holds the claim)."""
    return _record_rank(config, RecordRequest.from_json(request), None).to_json()


def _record_rank(
    config: dict[str, Any], request: RecordRequest, on_step: Callable[[int, float], None] | None
) -> RunSummary:
    """Build the workload and train and trace it into the claimed ``request.out``. The config's ``[run]``
    (``--steps``, ``--checkpoint-every``) wins over the workload's own (a Trainer's ``max_steps`` and save
    interval)."""
    w = build_workload(request.workload, config, resolve_device(request.device))
    asked = {f.name: config["run"][f.name] for f in fields(RunSettings) if f.name in config.get("run", {})}
    config = {**w.config, "run": {**w.config.get("run", {}), **asked}}
    run = RunSettings.of(config)
    rank = (
        torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
    )
    extra = {"workload": request.workload, **node_header(request.fault_profile, request.fault_seed, request.abft)}
    log = rank_dir(request.out, rank)
    first = resume_step(request.out, w.layout.world_size) if request.resume else None
    recorded = _header(log) if first is not None else None
    resumption = None
    if first is not None:
        end = log_end(log)
        resumption = Resumption(end.segments, first, end.records, end.last_step)
    run_id = recorded.run_id if recorded is not None else request.run_id
    run_info = RunInfo(
        request.node_label,
        config=config,
        seed=w.seed,
        data_order_fingerprint=w.data_order_fingerprint,
        extra=extra,
        run_id=run_id,
    )
    guard = default_guard(request.guard, abft=request.abft) if request.guard is not None else None
    tracer = Tracer(
        w.model,
        w.optimizer,
        out=request.out,
        run=run_info,
        options=request.trace,
        parallel=w.layout,
        guard=guard,
        resume=resumption,
        **({} if request.progress else {"echo": None}),
    )
    if recorded is not None:
        _check_resumable(recorded, tracer.header, request.out)
    node = emulated_node(
        tracer,
        w.model,
        fault_profile=request.fault_profile,
        fault_seed=request.fault_seed,
        abft=request.abft,
    )
    losses: list[float] = []
    start = time.perf_counter()
    every = run.checkpoint_every
    bar = tqdm(
        range(first or 0, run.steps),
        desc=f"record {request.out.name}",
        unit="step",
        leave=False,
        disable=None if request.progress and rank == 0 else True,
    )
    with tracer, node:
        if first is not None:  # last, so that nothing between it and the step draws from the restored RNGs
            with tracer.paused():  # restoring a sharded checkpoint may step the optimizer at lr 0 to create its state
                restore_step_checkpoint(request.out, first, rank, w.model, w.optimizer, w.states())
            tracer.restored()
        for step in bar:
            if every and step % every == 0 and step == first:
                tracer.event("checkpoint", at_step=step, rank=rank)  # saved before the crash: logged, not rewritten
            elif every and step % every == 0:
                tracer.checkpoint(step, data={"step": step}, states=w.states())
            if every and step % every == 0 and request.sharpness:
                _log_sharpness(w, tracer, step, request.sharpness)
            with tracer.step(step):
                loss = run_step(w, step, tracer)
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}")
            if on_step is not None:
                on_step(step, loss)
        if every and first == run.steps:
            tracer.event("checkpoint", at_step=run.steps, rank=rank)
        elif every:
            tracer.checkpoint(run.steps, data={"step": run.steps}, states=w.states())
        if every and request.sharpness:
            _log_sharpness(w, tracer, run.steps, request.sharpness)
    final = losses[-1] if losses else float("nan")
    return RunSummary(request.out, run.steps, final, time.perf_counter() - start, losses, first)


def _log_sharpness(w: Workload, tracer: Tracer, step: int, iterations: int) -> None:
    """The sharpness of the state before ``step``, as a ``sharpness`` event at that step."""
    with tracer.paused(), own_ops():
        s = sharpness(w, step, iterations=iterations)
    tracer.event(
        "sharpness",
        at_step=step,
        value=s.value,
        iterations=s.iterations,
        converged=s.converged,
        residual=s.residual,
        method=s.method,
        microbatch=s.microbatch,
    )


def _check_fork(fork: ForkPoint, out: Path, nproc: int) -> None:
    """A fork runs on as many ranks as the run it continues, into a directory of its own."""
    if Path(out).resolve() == fork.run.resolve():
        raise UsageError(
            f"--resume-from {fork.run}: names a checkpoint of --out itself; --resume continues a "
            "crashed run in place, --resume-from starts a new run from another run's checkpoint"
        )
    _check_resumed_ranks(fork.run, nproc)


def _check_resumed_ranks(out: Path, nproc: int) -> None:
    """A resumption runs on as many ranks as the recording it continues: checked before any rank starts."""
    ranks = list_ranks(out)
    if ranks and ranks == list(range(len(ranks))) and len(ranks) != nproc:
        raise UsageError(
            f"{out}: was recorded on {len(ranks)} rank(s), not {nproc}; resume it on as many "
            f"(--nproc {len(ranks)}, with the layout options it was recorded with)"
        )


def resume_step(out: Path, world_size: int) -> int:
    """The step a crashed recording restarts from: the newest checkpoint that every rank has and that every
    rank's log reaches (a step the log lacks cannot be superseded, only left out)."""
    ranks = list_ranks(out)
    if ranks != list(range(world_size)):
        raise UsageError(
            f"{out}: holds logs of ranks {ranks}, but the run has {world_size} rank(s); nothing to "
            "resume: record it again with --overwrite"
        )
    ends = []
    for rank in ranks:
        try:
            ends.append(log_end(rank_dir(out, rank)))
        except LogError as exc:
            raise UsageError(
                f"{out}: rank {rank}'s log cannot be continued ({exc}); record the run again with --overwrite"
            ) from exc
    if any(e.complete for e in ends):
        raise UsageError(f"{out}: the recording finished (its log has an END record): nothing to resume")
    reach = min(e.last_step + 1 if e.last_step is not None else 0 for e in ends)
    common = set.intersection(*(set(list_step_checkpoints(out, rank)) for rank in ranks))
    usable = [step for step in common if step <= reach]
    if not usable:
        raise UsageError(
            f"{out}: no checkpoint at or before step {reach}, the first step its log lacks, to resume "
            "from; record the run again with --overwrite (and checkpoints: --checkpoint-every)"
        )
    return max(usable)


def _header(log: Path) -> RunHeader:
    try:
        return LogReader(log, on_corruption="skip").header
    except LogError as exc:
        raise UsageError(f"{log}: the log cannot be continued ({exc}); record the run again with --overwrite") from exc


def _check_resumable(recorded: RunHeader, header: RunHeader, out: Path) -> None:
    """A resumed recording must continue the run it resumes: the same training, node and emulated faults."""
    diffs = pairing_differences(recorded, header)
    diffs += [
        f"{name}: {getattr(recorded, name)!r} vs {getattr(header, name)!r}"
        for name in ("node_label", "role", "device")
        if getattr(recorded, name) != getattr(header, name)
    ]
    diffs += [
        f"extra.{key}: {recorded.extra.get(key)!r} vs {header.extra.get(key)!r}"
        for key in ("workload", "fault_profile", "abft")
        if recorded.extra.get(key) != header.extra.get(key)
    ]
    if diffs:
        raise UsageError(
            f"{out}: --resume would not continue the recorded run; give the options it was recorded with "
            f"(recorded vs now): " + "; ".join(diffs)
        )


def record_run(
    config: Config | Mapping[str, Any],
    out: str | Path,
    *,
    node_label: str,
    on_step: Callable[[int, float], None] | None = None,
    **options: Any,
) -> RunSummary:
    """`record` on one rank with the request's fields as keywords: the short form for scripts and tests."""
    return record(config, RecordRequest(out=Path(out), node_label=node_label, **options), on_step=on_step)
