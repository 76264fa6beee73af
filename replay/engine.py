"""Re-run recorded steps with golden state injected: parameter sync (RQ2) and lockstep (RQ1).

For every replayed step ``k``:

1. the *golden* workload, rebuilt from the nearest checkpoint and re-executed up to
   ``k`` with every fingerprint checked against the golden log, runs step ``k``
   once more and keeps the tensors the suspect is compared with;
2. the *suspect* workload starts from a copy of the golden state before ``k`` (this
   is the parameter sync) and runs step ``k`` on the suspect executor: the fault
   emulator on this machine when the suspect is an emulated node. When the suspect
   is this machine itself, step 1's re-execution already ran on it and was checked
   bit for bit against the golden log, so it serves as the suspect's execution too:
   the comparisons below are written for identical tensors and the step runs once.
   An emulated suspect's step runs once too when its emulator, run during step 1 as a
   trial, draws no fault (`Replayer._trial_step`);
3. ``param-sync`` compares the suspect's gradients with the golden ones;
   ``lockstep`` compares every site's output (forward) and input gradient
   (backward) with the golden tensor and then overwrites it with the golden one,
   so each site computes on golden inputs and its own error is isolated.

Results go to a replay log in the ordinary format (role ``replay``), which the
pipelines read with the same reader as any run.

A multi-rank run is replayed by as many ranks (`sdc replay` launches them): each
rebuilds its own shard from its own checkpoints and log, syncs its own parameters,
and all of them run the golden and the suspect step together, collectives included.
In lockstep a tensor-parallel site's output is its partial sum before the
reduce-scatter, so every rank communicates golden partials and a fault stays on the
rank it happened on.
"""

from __future__ import annotations

import functools
import re
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from tqdm import tqdm

from faults import FaultEmulator, FaultProfile, load_profile, profile_from_header
from replay.diagnosis import likely_causes
from replay.golden import GoldenRun, Key, VerifyingSink, index_key
from replay.metrics import TOTAL, Mismatch, gradient_noise, mismatch
from tracer.blobs import BlobStore
from tracer.checkpoint import load_checkpoint
from tracer.collectives import unobserved
from tracer.determinism import determinism_settings
from tracer.errors import ConfigError, SdcError, ValidationError
from tracer.fingerprint import TensorDigest
from tracer.guard.runtime import RngState
from tracer.header import software_versions
from tracer.intercept import own_ops
from tracer.log import LogReader, LogWriter, claim_out_dir, rank_dir
from tracer.log.records import EventRecord, Phase, RunHeader
from tracer.options import RunInfo, TraceOptions
from tracer.pairing import check_pair
from tracer.rng import TorchRng, recorded_rng
from tracer.site_hooks import SiteHooks
from tracer.sites import find_sites
from tracer.tracing import Tracer
from workload.config import Config
from workload.protocol import REFERENCE, Workload, build_workload, run_step

Mode = Literal["param-sync", "lockstep"]
MODES: tuple[Mode, ...] = ("param-sync", "lockstep")
GoldenFrom = Literal["auto", "blobs", "reexec"]


@dataclass(frozen=True)
class Suspect:
    """What plays the suspect node: this machine, optionally with an emulated fault profile."""

    label: str
    profile: FaultProfile | None
    fault_seed: int
    source: dict[str, Any]


def suspect_from_profile(spec: str, fault_seed: int = 0) -> Suspect:
    profile = load_profile(spec)
    return Suspect(f"emulated:{profile.name}", profile, fault_seed, {"kind": "profile", **profile.header(fault_seed)})


def suspect_from_run(path: str | Path, golden: RunHeader, golden_path: Path) -> Suspect:
    """The node that recorded ``path``; the fault profile it ran, if any, is emulated again from the run's
    header, which holds the whole profile (profiles are data: nothing is imported)."""
    path = Path(path)
    header = LogReader(rank_dir(path, 0)).header
    check_pair(golden, header, str(golden_path), str(path))
    source = {"kind": "run", "path": str(path), "run_id": header.run_id, "node_label": header.node_label}
    recorded = header.extra.get("fault_profile")
    if not recorded:
        return Suspect(header.node_label, None, 0, source)
    if not isinstance(recorded, dict):
        raise ValidationError(f"{path}: its header's fault_profile is not a table; the run header is damaged")
    try:
        profile = profile_from_header(recorded)
    except SdcError as exc:
        raise ValidationError(f"{path}: {exc}; or replay with --fault-profile FILE --fault-seed "
                              f"{recorded.get('seed', 0)} instead of --suspect") from None
    seed = recorded.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValidationError(f"{path}: its header's fault_profile.seed = {seed!r} is not an integer")
    return Suspect(header.node_label, profile, seed, {**source, "fault_profile": recorded})


@dataclass(frozen=True)
class ReplayRequest:
    """One replay, as `sdc replay` and `sdc study` ask for it; the same on every rank."""

    golden: Path
    out: Path
    steps: range  # stop exclusive
    mode: Mode = "lockstep"
    suspect: Path | None = None  # the suspect's recorded run; its fault profile, if any, is emulated again
    fault_profile: str | None = None  # or: emulate this profile (a shipped name or a TOML path)
    fault_seed: int = 0
    golden_from: GoldenFrom = "auto"
    workload: str | None = None  # the factory that rebuilds the golden run (None: the reference workload)
    overwrite: bool = False
    progress: bool = True
    clip: bool = False  # cut ``steps`` at the run's last step instead of refusing

    def to_json(self) -> dict[str, Any]:
        """Plain data for the launcher, which hands the request to every rank's process."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "golden": str(self.golden),
                "out": str(self.out), "steps": [self.steps.start, self.steps.stop],
                "suspect": str(self.suspect) if self.suspect is not None else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayRequest:
        paths = {k: Path(data[k]) if data[k] is not None else None for k in ("golden", "out", "suspect")}
        return cls(**{**data, **paths, "steps": range(*data["steps"])})


def replay(request: ReplayRequest) -> ReplaySummary:
    """Replay ``request`` on this rank: the suspect is its recorded run's node or an emulated profile."""
    if (request.suspect is None) == (request.fault_profile is None):
        raise ConfigError("a replay needs exactly one of --suspect RUN or --fault-profile PROFILE")
    if request.suspect is not None:
        header = LogReader(rank_dir(request.golden, 0)).header
        suspect = suspect_from_run(request.suspect, header, request.golden)
    else:
        suspect = suspect_from_profile(request.fault_profile, request.fault_seed)
    return Replayer(request, suspect).run()


def workload_entry(golden: GoldenRun, named: str | None) -> str:
    """The factory that rebuilds ``golden``: the one the user named, or the reference workload when the
    run says it was recorded with it. A run's header never makes replay import code by itself."""
    recorded = golden.header.extra.get("workload")
    if named is not None:
        if recorded is not None and recorded != named:
            print(f"note: {golden.path} was recorded with --workload {recorded}; replaying with {named}",
                  file=sys.stderr)
        return named
    if recorded == REFERENCE or (recorded is None and _is_reference_config(golden.header.config)):
        return REFERENCE
    if recorded is not None:
        raise ConfigError(f"{golden.path}: was recorded with workload {recorded!r}; replay imports only code you "
                          f"name, so pass --workload {recorded} if you trust it")
    raise ConfigError(f"{golden.path}: was recorded by a training loop of your own; pass --workload "
                      "package.module:factory naming a factory that rebuilds it (README: Your own training)")


def _is_reference_config(config: dict[str, Any]) -> bool:
    try:
        Config.from_dict(config)
    except ConfigError:
        return False
    return True


def parse_steps(text: str) -> range:
    """``"10:20"`` (stop exclusive) or ``"12"``."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            steps = range(int(a), int(b))
        else:
            steps = range(int(text), int(text) + 1)
    except ValueError:
        raise ConfigError(f"--steps {text!r}: expected START:STOP (stop exclusive) or one step, e.g. 10:20") from None
    if not steps or steps.start < 0:
        raise ConfigError(f"--steps {text!r}: the range is empty; STOP must be greater than START >= 0")
    return steps


@dataclass
class StepResult:
    step: int
    golden_loss: float
    suspect_loss: float
    worst_frequency: float = 0.0  # lockstep: max over sites
    noise: float | None = None  # param-sync: total noise-to-signal
    faults: int = 0
    wall_s: float = 0.0  # golden re-execution and suspect step together


@dataclass
class ReplaySummary:
    out: Path
    mode: Mode
    steps: list[StepResult] = field(default_factory=list)
    checked: int = 0  # golden fingerprints verified
    wall_s: float = 0.0


class _Clock:
    """The step/microbatch bookkeeping `run_step` and the fault emulator need, without a log."""

    def __init__(self, step: int) -> None:
        self.step_index = step
        self.microbatch_index = 0

    def microbatch(self, index: int, inputs: Any = None) -> None:
        self.microbatch_index = index

    def loss(self, value: torch.Tensor | float) -> None:
        pass  # `run_step` returns the step's loss


class _Both:
    """Reports a step to the golden Tracer and to the suspect emulator's clock."""

    def __init__(self, tracer: Tracer, clock: _Clock) -> None:
        self.tracer, self.clock = tracer, clock

    def microbatch(self, index: int, inputs: Any = None) -> None:
        self.clock.microbatch(index)
        self.tracer.microbatch(index, inputs)

    def loss(self, value: torch.Tensor | float) -> None:
        self.tracer.loss(value)


class Replayer:
    """Replays ``steps`` of ``golden`` on ``suspect`` and writes the replay log to ``out``."""

    def __init__(self, request: ReplayRequest, suspect: Suspect) -> None:
        if request.mode not in MODES:
            raise ConfigError(f"--mode {request.mode!r}: choose one of {', '.join(MODES)}")
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.rank = torch.distributed.get_rank() if dist else 0
        steps = request.steps
        self.golden = GoldenRun.open(request.golden, steps.start, steps.stop, self.rank)
        g = self.golden
        if request.clip:  # a window around a divergence may run past the end of the run
            steps = range(steps.start, min(steps.stop, g.last_step + 1))
        if steps.stop - 1 > g.last_step:
            raise ValidationError(
                f"{g.path}: steps {steps.start}:{steps.stop} reach beyond the recorded steps 0..{g.last_step}"
            )
        self.workload = workload_entry(g, request.workload)
        self.suspect = suspect
        self.steps = steps
        self.mode = request.mode
        self.out = request.out
        self.inputs = (request.golden, request.suspect)
        self.golden_from = request.golden_from
        self.overwrite = request.overwrite
        self.progress = request.progress
        names = sorted({re.sub(r"\[.*\]$", "", s) for s in g.sites})
        self.site_pattern = "|".join(re.escape(n) for n in names) if names else None
        self._log: LogWriter | None = None

    # -- the whole replay -------------------------------------------------------------
    def run(self) -> ReplaySummary:
        claim = self.rank == 0  # the other ranks wait for rank 0 to clear the directory
        lock = claim_out_dir(self.out, role="replay", overwrite=self.overwrite, inputs=self.inputs) if claim else None
        with lock or nullcontext():
            return self._run()

    def _run(self) -> ReplaySummary:
        summary = ReplaySummary(self.out, self.mode)
        start = time.perf_counter()
        device = torch.device("cpu")
        config = self.golden.header.config
        golden_w, suspect_w = (build_workload(self.workload, config, device) for _ in range(2))
        if golden_w.layout.world_size > 1:
            torch.distributed.barrier()  # no rank writes before rank 0 has cleared the directory
        checkpoint = load_checkpoint(self.golden.path, self.golden.start_checkpoint, self.rank)
        checkpoint.restore(golden_w.model, golden_w.optimizer, golden_w.states())
        self._log = LogWriter(rank_dir(self.out, self.rank), self._header(str(next(golden_w.model.parameters()).device)))
        total = self.steps.stop - self.golden.start_checkpoint
        show = self.progress and self.rank == 0
        bar = tqdm(total=total, desc=f"replay {self.mode}", unit="step", disable=None if show else True, leave=False)
        try:
            for step in range(self.golden.start_checkpoint, self.steps.start):
                bar.set_postfix_str(f"rebuilding step {step}")
                self._golden_step(golden_w, step, keep=False, summary=summary)
                bar.update()
            tried_last = True
            for step in self.steps:
                bar.set_postfix_str(f"step {step}")
                t0 = time.perf_counter()
                if self.suspect.profile is None:
                    # This machine is the suspect: its re-execution, checked bit for bit against the golden log,
                    # is the suspect's execution too. A second run could only differ by a fault of its own.
                    golden, golden_loss = self._golden_step(golden_w, step, keep=True, summary=summary)
                    result = self._identical_to_golden(step, golden, golden_loss)
                elif (trial := self._trial_step(golden_w, step, summary, tried_last)) is not None:
                    golden, golden_loss = trial
                    result = self._identical_to_golden(step, golden, golden_loss)
                else:
                    _sync_parameters(golden_w.model, suspect_w.model)  # the parameter sync
                    suspect: list[StepResult] = []
                    golden, golden_loss = self._golden_step(
                        golden_w, step, keep=True, summary=summary,
                        between=lambda kept: suspect.append(self._suspect_step(suspect_w, step, kept)),
                    )
                    result = suspect[0]
                    if self.mode == "param-sync":
                        self._gradient_noise(w=suspect_w, step=step, golden=golden, result=result)
                result.golden_loss = golden_loss
                # A step whose suspect had faults is often followed by another (bursts): try again after a clean one.
                tried_last = result.faults == 0
                result.wall_s = time.perf_counter() - t0
                summary.steps.append(result)
                self._log.write_event(
                    EventRecord(
                        "replay_step",
                        step,
                        {"golden_loss": golden_loss, "suspect_loss": result.suspect_loss, "faults": result.faults},
                    )
                )
                self._log.flush()
                bar.update()
        except BaseException as exc:
            self._log.close("failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            bar.close()
        self._log.close("complete")
        summary.wall_s = time.perf_counter() - start
        return summary

    def _header(self, device: str) -> RunHeader:
        g = self.golden.header
        return RunHeader(
            schema_version=g.schema_version,
            run_id=uuid.uuid4().hex,
            node_label=self.suspect.label,
            role="replay",
            world_size=g.world_size,
            rank=self.rank,
            config=g.config,
            config_fingerprint=g.config_fingerprint,
            seed=g.seed,
            data_order_fingerprint=g.data_order_fingerprint,
            fingerprint_algorithm=g.fingerprint_algorithm,
            versions=software_versions(),
            device=device,
            determinism=determinism_settings(),
            created_unix=time.time(),
            extra={
                **({"parallel": g.extra["parallel"]} if "parallel" in g.extra else {}),
                "replay": {
                    "mode": self.mode,
                    "steps": [self.steps.start, self.steps.stop],
                    "golden": {"path": str(self.golden.path), "run_id": g.run_id, "node_label": g.node_label},
                    "suspect": self.suspect.source,
                    "golden_from": self.golden_from,
                    "workload": self.workload,
                }
            },
        )

    # -- golden side --------------------------------------------------------------------
    def _golden_step(
        self,
        w: Workload,
        step: int,
        *,
        keep: bool,
        summary: ReplaySummary,
        between: Callable[[dict[Key, torch.Tensor]], None] | None = None,
        trial: tuple[FaultEmulator, _Clock, list[dict[str, Any]], RngState] | None = None,
    ) -> tuple[dict[Key, torch.Tensor], float] | None:
        """Re-execute ``step`` verifying every fingerprint; with ``keep``, return its tensors.

        ``between`` runs after the golden forward and backward and before the golden
        optimizer step, while the parameters are still those before ``step``: the
        suspect runs there, with the golden site tensors at hand. With ``trial`` the
        step runs under the suspect's emulator (see `_trial_step`), and None means
        that a fault fired or a fingerprint differed, and the step was undone.
        """
        sink = VerifyingSink(self.golden.expected)
        rng_problem = self._rng_at_start(step)
        start = RngState()  # the suspect's step starts from the same RNG state (its dropout draws the same masks)
        kept: dict[Key, torch.Tensor] = {}
        phases = {Phase.GRAD} | ({Phase.FORWARD, Phase.BACKWARD} if self.mode == "lockstep" else set())
        tracer = _KeepingTracer(
            w.model, w.optimizer, sink=sink, run=RunInfo("golden-reexecution", config=self.golden.header.config),
            options=TraceOptions(sites=self.site_pattern), parallel=w.layout,
        )
        tracer.keep(kept if keep else None, phases)
        with tracer, tracer.step(step):
            if trial is not None:
                emulator, clock, faults, rng = trial
                with emulator:
                    loss = run_step(w, step, _Both(tracer, clock), update=False)
                if faults or sink.divergences:
                    rng.restore()
                    return None
            else:
                loss = run_step(w, step, tracer, update=False)
            if between is not None:
                if keep and self.golden_from != "reexec":
                    self._substitute_blobs(step, kept)
                with unobserved():  # the suspect's collectives are not the golden run's
                    after = RngState()
                    start.restore()
                    between(kept)
                    after.restore()
            w.update(step)
        summary.checked += sink.checked
        if sink.divergences:
            assert self._log is not None
            for d in sink.divergences:
                self._log.write_event(
                    EventRecord(
                        "replay_divergence",
                        d.step,
                        {"microbatch": d.microbatch, "name": d.name, "phase": int(d.phase), "expected": d.expected, "found": d.found},
                    )
                )
            raise ValidationError(self._divergence_message(w, step, sink, rng_problem))
        return kept, loss

    def _rng_at_start(self, step: int) -> str | None:
        """Give the global torch RNG the state the recording had at ``step``'s start where its log stored it
        (tracer/rng.py); None, or what is wrong with the state here when the log has only its fingerprint."""
        fields = self.golden.rng.get(step)
        if fields is None:
            return None  # recorded before `rng` events: the checkpoint's RNG, as before
        if fields["stored"]:
            recorded_rng(BlobStore(self.golden.path), fields).restore()
            return None
        here = TorchRng.now().fingerprint
        if here == fields["fingerprint"]:
            return None
        return (f"its state at step {step}'s start is not the recording's (fingerprint {here:016x}, the log has "
                f"{fields['fingerprint']:016x}), and the log did not store it because the recording had it at the "
                "step before's end or at a checkpoint: the replay workload drew from the global RNG between steps "
                "(building or iterating a data loader without its own generator?); make it draw from its own "
                "generators, e.g. DataLoader(..., generator=torch.Generator().manual_seed(s))")

    def _divergence_message(self, w: Workload, step: int, sink: VerifyingSink, rng_problem: str | None) -> str:
        first = sink.divergences[0]
        where = (f"re-executing the golden run on this machine diverged from its log at {first.describe()} "
                 f"({len(sink.divergences)} tensors differ in step {step})")
        causes = likely_causes(sink.divergences, self.golden.metas, w.model, logs_rng=self.golden.logs_rng,
                               rng_problem=rng_problem, checkpoint=self.golden.start_checkpoint)
        if causes:
            return (f"{where}; replay does not reproduce the recording here: " + "; ".join(causes)
                    + ". Only if none of this applies, suspect this machine (check with `sdc verify-determinism`)")
        return (f"{where}: this machine is not deterministic with the golden run's settings, or it corrupts data "
                "itself; run the replay on a healthy machine with the same software, or check with "
                "`sdc verify-determinism`")

    def _substitute_blobs(self, step: int, kept: dict[Key, torch.Tensor]) -> None:
        store = BlobStore(self.golden.path)
        for key in list(kept):
            fp = self.golden.blobs.get(key)
            if fp is not None:
                kept[key] = store.get(fp)
            elif self.golden_from == "blobs" and key[3] in (Phase.FORWARD, Phase.BACKWARD):
                s, mb, name, phase = key
                raise ValidationError(
                    f"{self.golden.path}: no captured tensor for step {s}, microbatch {mb}, {phase.name.lower()} "
                    f"{name}; record the golden run with --capture-steps covering {self.steps.start}:"
                    f"{self.steps.stop}, or replay with --golden-from reexec"
                )

    # -- suspect side -------------------------------------------------------------------
    def _suspect_step(self, w: Workload, step: int, golden: dict[Key, torch.Tensor]) -> StepResult:
        assert self._log is not None
        log = self._log
        clock = _Clock(step)
        faults = 0

        def sink(kind: str, fields: dict[str, Any]) -> None:
            nonlocal faults
            faults += kind == "fault"
            log.write_event(EventRecord(kind, clock.step_index, fields))

        result = StepResult(step, 0.0, 0.0)
        with ExitStack() as stack:
            if self.suspect.profile is not None:
                stack.enter_context(
                    self._emulator(w, clock, sink)
                )
            # The same site hooks as the golden re-execution's Tracer, so both sum gradients in the same order.
            sites = find_sites(w.model, self.site_pattern) if self.site_pattern else []
            if self.mode == "lockstep":
                report = functools.partial(self._site, step, result=result)
                stack.enter_context(_lockstep(sites, golden, clock, report))
            else:
                stack.enter_context(SiteHooks(sites, on_output=_unchanged, on_input_grad=_unchanged))
            # The suspect's own update is never used: the next step syncs from golden again.
            result.suspect_loss = run_step(w, step, clock, update=False)
        result.faults = faults
        return result

    def _emulator(self, w: Workload, clock: _Clock, sink: Callable[[str, dict[str, Any]], None]) -> FaultEmulator:
        """The suspect's fault emulator on ``w``, drawing by ``clock``."""
        assert self.suspect.profile is not None
        return FaultEmulator(self.suspect.profile, w.model, clock=lambda: (clock.step_index, clock.microbatch_index),
                             sink=sink, seed=self.suspect.fault_seed, sites=self.site_pattern)

    def _trial_step(
        self, w: Workload, step: int, summary: ReplaySummary, worth_it: bool
    ) -> tuple[dict[Key, torch.Tensor], float] | None:
        """Run ``step`` once as the golden re-execution with the suspect's fault emulator on. Most steps of most
        nodes draw no fault: then this one execution matched the golden log bit for bit and was the suspect's
        too, and the step is done. Otherwise (None) it left no trace: no update, no event, the RNG as before, and
        the step runs as usual. Single-rank only: ranks would have to agree on the outcome."""
        if not worth_it or self.suspect.profile is None or w.layout.world_size > 1:
            return None
        rng = RngState()
        faults: list[dict[str, Any]] = []
        clock = _Clock(step)
        emulator = self._emulator(w, clock, lambda kind, fields: faults.append({"kind": kind, **fields}))
        return self._golden_step(w, step, keep=True, summary=summary, trial=(emulator, clock, faults, rng))

    def _identical_to_golden(self, step: int, golden: dict[Key, torch.Tensor], loss: float) -> StepResult:
        """The results of a suspect execution that is the golden one: what `_suspect_step` and the comparisons
        would write for bit-identical tensors, without running the step again."""
        if self.golden_from != "reexec":
            self._substitute_blobs(step, golden)  # equal to the re-execution's bits; `blobs` insists on them
        result = StepResult(step, loss, loss)
        if self.mode == "param-sync":
            self._gradient_noise(w=None, step=step, golden=golden, result=result)
            return result
        for (_, mb, site, phase), tensor in golden.items():
            if phase in (Phase.FORWARD, Phase.BACKWARD):
                self._site(step, mb, site, phase, Mismatch(tensor.numel(), 0, 0.0, None, 0.0, 0), result=result)
        return result

    def _gradient_noise(
        self, *, w: Workload | None, step: int, golden: dict[Key, torch.Tensor], result: StepResult
    ) -> None:
        """Compare the suspect's clipped gradients, left in ``.grad`` (the golden ones when ``w`` is None), with
        the golden ones."""
        assert self._log is not None
        golden_grads = {k[2]: t for k, t in golden.items() if k[3] == Phase.GRAD}
        grads = golden_grads if w is None else {n: p.grad for n, p in w.model.named_parameters() if p.grad is not None}
        with own_ops():
            noises = gradient_noise(grads, golden_grads)
        for noise in noises:
            self._log.write_event(EventRecord("grad_noise", step, noise.fields()))
            if noise.name == TOTAL:
                result.noise = noise.ratio

    def _site(self, step: int, mb: int, site: str, phase: Phase, m: Mismatch, *, result: StepResult) -> None:
        assert self._log is not None
        fields = {"microbatch": mb, "site": site, "phase": phase.name.lower(), **m.fields()}
        self._log.write_event(EventRecord("site_mismatch", step, fields))
        result.worst_frequency = max(result.worst_frequency, m.frequency)


def _sync_parameters(golden: nn.Module, suspect: nn.Module) -> None:
    """Give the suspect the golden parameters; it never updates, so no optimizer state is needed."""
    with own_ops(), torch.no_grad():
        for (name, g), (_, s) in zip(golden.state_dict().items(), suspect.state_dict().items()):
            s.copy_(g)


class _KeepingTracer(Tracer):
    """The golden re-execution's Tracer, which also keeps the tensors the suspect is compared with: the
    same hooks that recorded the golden run, so re-execution builds the very same autograd graph."""

    _kept: dict[Key, torch.Tensor] | None = None
    _phases: frozenset[Phase] = frozenset()

    def keep(self, kept: dict[Key, torch.Tensor] | None, phases: set[Phase]) -> None:
        self._kept, self._phases = kept, frozenset(phases)
        self._params = frozenset(self._names.values())

    def record_many(
        self, named: list[tuple[str, torch.Tensor]], phase: Phase, microbatch: int | None = None, *,
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


def _unchanged(site: str, tensor: torch.Tensor) -> None:
    return None


def _lockstep(
    sites: list[tuple[str, nn.Module]],
    golden: dict[Key, torch.Tensor],
    clock: _Clock,
    report: Callable[[int, str, Phase, Mismatch], None],
) -> SiteHooks:
    """Compare each site's output and input gradient with the golden one, report it, and go on with the golden one."""

    def overwrite(phase: Phase) -> Callable[[str, torch.Tensor], torch.Tensor]:
        def callback(site: str, suspect: torch.Tensor) -> torch.Tensor:
            mb = clock.microbatch_index
            g = golden[(clock.step_index, mb, site, phase)]
            with own_ops():
                report(mb, site, phase, mismatch(suspect, g))
                return g.clone()

        return callback

    return SiteHooks(sites, on_output=overwrite(Phase.FORWARD), on_input_grad=overwrite(Phase.BACKWARD))
