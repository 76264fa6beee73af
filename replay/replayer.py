"""The `Replayer`: re-run recorded steps with golden state injected, parameter sync (RQ2) and lockstep (RQ1).

    summary = Replayer(ReplayRequest(golden, out, steps, suspect, mode="lockstep")).run()

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
   An emulated suspect's step runs once too when no rule of its emulator is armed in
   the step (`FaultEmulator.may_fire`), and in param-sync when its emulator, run
   during step 1 as a trial, draws no fault; when the trial draws one, it was the
   suspect's step, and the golden step runs once more: two executions, never three
   (`Replayer._replay_step`);
3. ``param-sync`` compares the suspect's gradients with the golden ones;
   ``lockstep`` compares every site's output (forward) and input gradient
   (backward) with the golden tensor and then overwrites it with the golden one,
   so each site computes on golden inputs and its own error is isolated
   (replay/injection.py).

Results go to a replay log in the ordinary format (role ``replay``), which the
pipelines read with the same reader as any run.

The replay log's directory is claimed by the job that runs the Replayer (jobs/replay.py),
once, before any rank starts. A multi-rank run is replayed by as many ranks (the job
launches them): each
rebuilds its own shard from its own checkpoints and log, syncs its own parameters,
and all of them run the golden and the suspect step together, collectives included.
In lockstep a tensor-parallel site's output is its partial sum before the
reduce-scatter, so every rank communicates golden partials and a fault stays on the
rank it happened on.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from faults import FaultEmulator
from replay.diagnosis import likely_causes
from replay.golden import GoldenRun, KeepingTracer, Key, VerifyingSink, index_key, workload_entry
from replay.injection import (
    StepClock,
    compared_in_lockstep,
    lockstep_hooks,
    lockstep_receives,
    passthrough_hooks,
    sync_parameters,
)
from replay.metrics import TOTAL, Mismatch, gradient_noise
from replay.request import ReplayRequest
from replay.results import ReplaySummary, StepResult
from replay.sharded_noise import whole_model_noise
from tracer.blobs import BlobStore
from tracer.checkpoint import restore_step_checkpoint
from tracer.collectives import observing, unobserved
from tracer.determinism import determinism_settings
from tracer.errors import ValidationError
from tracer.guard.runtime import RngState
from tracer.header import software_versions
from tracer.intercept import own_ops
from tracer.log import LogWriter, rank_dir
from tracer.log.records import EventRecord, Phase, RunHeader
from tracer.options import RunInfo
from tracer.rng import TorchRng, recorded_rng
from tracer.sharding import local_shard
from tracer.sites import named_parameters, sites_named
from tracer.tracing import Tracer
from workload.protocol import Workload, build_workload, run_step

# What of golden's header extra the replay log repeats, rank by rank: what pairing compares (tracer/pairing.py).
PAIRED_EXTRA = ("parallel", "shards", "sites", "wrappers")


class _Both:
    """Reports a step to the golden Tracer and to the suspect emulator's clock."""

    def __init__(self, tracer: Tracer, clock: StepClock) -> None:
        self.tracer, self.clock = tracer, clock

    def microbatch(self, index: int, inputs: Any = None) -> None:
        self.clock.microbatch(index)
        self.tracer.microbatch(index, inputs)

    def loss(self, value: torch.Tensor | float) -> None:
        self.tracer.loss(value)


@dataclass
class _Trial:
    """What a trial (`Replayer._trial_step`), the suspect's step run as the golden re-execution, keeps of it."""

    clock: StepClock
    rng: RngState  # the global RNG before the step: the undone trial leaves it so
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # the emulator's, in order
    loss: float = 0.0
    gradients: dict[str, torch.Tensor] = field(default_factory=dict)  # clipped, as the optimizer would take them
    after: RngState | None = None  # the global RNG after the step

    def sink(self, kind: str, fields: dict[str, Any]) -> None:
        self.events.append((kind, fields))

    @property
    def faults(self) -> int:
        return sum(kind == "fault" for kind, _ in self.events)

    def undo(self, loss: float, model: torch.nn.Module) -> None:
        """Keep the step's loss, a copy of its gradients and the global RNG's state after it, and give the RNG its
        state from before."""
        self.loss = loss
        with own_ops():
            self.gradients = {n: t.clone() for n, t in clipped_gradients(model).items()}
        self.after = RngState()
        self.rng.restore()


def clipped_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The gradients a step with ``update=False`` left in ``.grad`` (accumulated and clipped), this rank's shards,
    under the names the Tracer gives them (DDP's ``module.`` left out, `tracer.sites.named_parameters`)."""
    return {n: local_shard(p.grad) for n, p in named_parameters(model) if p.grad is not None}


class Replayer:
    """Replays ``steps`` of ``golden`` on ``suspect`` and writes the replay log to ``out``."""

    def __init__(self, request: ReplayRequest, *, shortcuts: bool = True) -> None:
        """``shortcuts=False`` runs every replayed step as the golden step with the suspect's inside it, the
        reference the shortcuts of `_replay_step` write the same replay log as (tests compare them)."""
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
        self.suspect = request.suspect
        self.steps = steps
        self.mode = request.mode
        self.out = request.out
        self.golden_from = request.golden_from
        self.progress = request.progress
        self.run_id = request.run_id or uuid.uuid4().hex
        self.shortcuts = shortcuts
        self._log: LogWriter | None = None
        self._schedule: FaultEmulator | None = None  # the suspect's emulator, asked which steps it may fire in
        self._executions = 0  # of the step being replayed: golden re-executions and suspect steps
        self._armed = {True: 0, False: 0}  # replayed steps the suspect's emulator was armed in, by whether it fired

    # -- the whole replay -------------------------------------------------------------
    def run(self) -> ReplaySummary:
        """Replay every step into the replay log; its directory is the job's to claim (jobs/replay.py)."""
        summary = ReplaySummary(self.out, self.mode)
        start = time.perf_counter()
        device = torch.device("cpu")
        config = self.golden.header.config
        golden_w, suspect_w = (build_workload(self.workload, config, device) for _ in range(2))
        if self.suspect.profile is not None:
            self._schedule = self._emulator(golden_w, StepClock(0), lambda kind, fields: None)
        restore_step_checkpoint(
            self.golden.path,
            self.golden.start_checkpoint,
            self.rank,
            golden_w.model,
            golden_w.optimizer,
            golden_w.states(),
        )
        self._log = LogWriter(
            rank_dir(self.out, self.rank), self._header(str(next(golden_w.model.parameters()).device))
        )
        total = self.steps.stop - self.golden.start_checkpoint
        show = self.progress and self.rank == 0
        bar = tqdm(total=total, desc=f"replay {self.mode}", unit="step", disable=None if show else True, leave=False)
        try:
            for step in range(self.golden.start_checkpoint, self.steps.start):
                bar.set_postfix_str(f"rebuilding step {step}")
                self._golden_step(golden_w, step, keep=False, summary=summary)
                bar.update()
            for step in self.steps:
                bar.set_postfix_str(f"step {step}")
                t0 = time.perf_counter()
                self._executions = 0
                result = self._replay_step(golden_w, suspect_w, step, summary)
                result.executions = self._executions
                result.wall_s = time.perf_counter() - t0
                summary.steps.append(result)
                self._log.write_event(
                    EventRecord(
                        "replay_step",
                        step,
                        {
                            "golden_loss": result.golden_loss,
                            "suspect_loss": result.suspect_loss,
                            "faults": result.faults,
                        },
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

    def _replay_step(self, golden_w: Workload, suspect_w: Workload, step: int, summary: ReplaySummary) -> StepResult:
        """Replay ``step`` by the fewest executions that write what golden + suspect would (docs/replay.md):

        - one, when the suspect is this machine (its re-execution, checked bit for bit against the golden log, is
          the suspect's execution too: a second run could only differ by a fault of its own), or when no rule of
          the suspect's emulator is armed in the step (`FaultEmulator.may_fire`: it would run exactly the same);
        - param-sync, one rank: the trial (`_trial_step`) runs the step under the suspect's emulator from the
          golden state, which is the parameter-synced suspect step. Nothing fired: one execution was both. A fault
          fired: the trial was the suspect's step, and the golden step runs once more (two);
        - lockstep: the golden step with the suspect's inside it (two): a lockstep suspect needs the golden site
          tensors while it runs. A trial first costs one when nothing fires and three when a fault does, so it
          runs only once more of this replay's armed steps were clean than faulty (a node armed on every step
          whose faults are rare), never on a burst's steps, which mostly fire;
        - several ranks: golden with the suspect inside (two): ranks would have to agree on a trial's outcome.
        """
        one_rank = golden_w.layout.world_size == 1
        if self.shortcuts and (self._schedule is None or (one_rank and not self._schedule.may_fire(step))):
            golden, golden_loss = self._golden_kept(golden_w, step, summary)
            return self._identical_to_golden(step, golden, golden_loss)
        result = None
        if self.shortcuts and one_rank and (self.mode == "param-sync" or self._armed[False] > self._armed[True]):
            result = self._trial_step(golden_w, step, summary)
        if result is None:
            result = self._golden_and_suspect(golden_w, suspect_w, step, summary)
        self._armed[result.faults > 0] += 1
        return result

    def _golden_and_suspect(
        self, golden_w: Workload, suspect_w: Workload, step: int, summary: ReplaySummary
    ) -> StepResult:
        """The golden step with the suspect's, from the synced parameters, run inside it (two executions)."""
        sync_parameters(golden_w.model, suspect_w.model)  # the parameter sync
        suspect: list[StepResult] = []
        golden, golden_loss = self._golden_kept(
            golden_w, step, summary, between=lambda kept: suspect.append(self._suspect_step(suspect_w, step, kept))
        )
        result = suspect[0]
        result.golden_loss = golden_loss
        if self.mode == "param-sync":
            self._gradient_noise(step, golden, result, clipped_gradients(suspect_w.model))
        return result

    def _header(self, device: str) -> RunHeader:
        g = self.golden.header
        return RunHeader(
            schema_version=g.schema_version,
            run_id=self.run_id,
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
                **{k: g.extra[k] for k in PAIRED_EXTRA if k in g.extra},  # it pairs with golden's, whatever the split
                "replay": {
                    "mode": self.mode,
                    "steps": [self.steps.start, self.steps.stop],
                    "golden": {"path": str(self.golden.path), "run_id": g.run_id, "node_label": g.node_label},
                    "suspect": self.suspect.source,
                    "golden_from": self.golden_from,
                    "workload": self.workload,
                },
            },
        )

    # -- golden side --------------------------------------------------------------------
    def _golden_kept(
        self,
        w: Workload,
        step: int,
        summary: ReplaySummary,
        between: Callable[[dict[Key, torch.Tensor]], None] | None = None,
    ) -> tuple[dict[Key, torch.Tensor], float]:
        """`_golden_step` with ``keep``, outside a trial: its tensors and loss (only a trial's step is undone)."""
        got = self._golden_step(w, step, keep=True, summary=summary, between=between)
        assert got is not None, "a golden step outside a trial returns what it kept"
        return got

    def _golden_step(
        self,
        w: Workload,
        step: int,
        *,
        keep: bool,
        summary: ReplaySummary,
        between: Callable[[dict[Key, torch.Tensor]], None] | None = None,
        trial: tuple[FaultEmulator, _Trial] | None = None,
    ) -> tuple[dict[Key, torch.Tensor], float] | None:
        """Re-execute ``step`` verifying every fingerprint; with ``keep``, return its tensors.

        ``between`` runs after the golden forward and backward and before the golden
        optimizer step, while the parameters are still those before ``step``: the
        suspect runs there, with the golden site tensors at hand. With ``trial`` the
        step runs under the suspect's emulator (see `_trial_step`), and None means
        that a fault fired or a fingerprint differed, and the step was undone.
        """
        self._executions += 1
        sink = VerifyingSink(self.golden.expected)
        rng_problem = self._rng_at_start(step)
        start = RngState()  # the suspect's step starts from the same RNG state (its dropout draws the same masks)
        kept: dict[Key, torch.Tensor] = {}
        phases = {Phase.GRAD} | ({Phase.FORWARD, Phase.BACKWARD} if self.mode == "lockstep" else set())
        tracer = self._verifying_tracer(w, sink)
        tracer.keep(kept if keep else None, phases)
        with tracer, tracer.step(step):
            if trial is not None:
                emulator, held = trial
                with emulator:
                    loss = run_step(w, step, _Both(tracer, held.clock), update=False)
                if held.events or sink.mismatches:
                    held.undo(loss, w.model)
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
        self._verified(w, step, sink, rng_problem)
        return kept, loss

    def _verified(self, w: Workload, step: int, sink: VerifyingSink, rng_problem: str | None = None) -> None:
        """Stop the replay when a re-executed fingerprint differed from the golden log, with its events written."""
        if sink.mismatches:
            assert self._log is not None
            for d in sink.mismatches:
                self._log.write_event(
                    EventRecord(
                        "replay_divergence",
                        d.step,
                        {
                            "microbatch": d.microbatch,
                            "name": d.name,
                            "phase": int(d.phase),
                            "expected": d.expected,
                            "found": d.found,
                        },
                    )
                )
            raise ValidationError(self._mismatch_message(w, step, sink, rng_problem))

    def _verifying_tracer(self, w: Workload, sink: VerifyingSink) -> KeepingTracer:
        """A Tracer on the golden workload whose records ``sink`` checks against the golden log."""
        return KeepingTracer(
            w.model,
            w.optimizer,
            sink=sink,
            run=RunInfo("golden-reexecution", config=self.golden.header.config),
            options=self.golden.site_options(w.model),
            parallel=w.layout,
        )

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
        return (
            f"its state at step {step}'s start is not the recording's (fingerprint {here:016x}, the log has "
            f"{fields['fingerprint']:016x}), and the log did not store it because the recording had it at the "
            "step before's end or at a checkpoint: the replay workload drew from the global RNG between steps "
            "(building or iterating a data loader without its own generator?); make it draw from its own "
            "generators, e.g. DataLoader(..., generator=torch.Generator().manual_seed(s))"
        )

    def _mismatch_message(self, w: Workload, step: int, sink: VerifyingSink, rng_problem: str | None) -> str:
        first = sink.mismatches[0]
        where = (
            f"re-executing the golden run on this machine diverged from its log at {first.describe()} "
            f"({len(sink.mismatches)} tensors differ in step {step})"
        )
        causes = likely_causes(
            sink.mismatches,
            self.golden.metas,
            w.model,
            logs_rng=self.golden.logs_rng,
            rng_problem=rng_problem,
            checkpoint=self.golden.start_checkpoint,
        )
        if causes:
            return (
                f"{where}; replay does not reproduce the recording here: "
                + "; ".join(causes)
                + ". Only if none of this applies, suspect this machine (check with `sdc verify-determinism`)"
            )
        return (
            f"{where}: this machine is not deterministic with the golden run's settings, or it corrupts data "
            "itself; run the replay on a healthy machine with the same software, or check with "
            "`sdc verify-determinism`"
        )

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
        self._executions += 1
        log = self._log
        clock = StepClock(step)
        faults = 0

        def sink(kind: str, fields: dict[str, Any]) -> None:
            nonlocal faults
            faults += kind == "fault"
            log.write_event(EventRecord(kind, clock.step_index, fields))

        result = StepResult(step, 0.0, 0.0)
        report = functools.partial(self._site, step, result=result)
        with ExitStack() as stack:
            if self.mode == "lockstep":  # outside the emulator: a corrupted receive is compared, then overwritten
                stack.enter_context(observing(lockstep_receives(golden, clock, report)))
            if self.suspect.profile is not None:
                stack.enter_context(self._emulator(w, clock, sink))
            # The same site hooks as the golden re-execution's Tracer, so both sum gradients in the same order.
            sites = sites_named(w.model, self.golden.site_names)
            if self.mode == "lockstep":
                stack.enter_context(lockstep_hooks(sites, golden, clock, report))
            else:
                stack.enter_context(passthrough_hooks(sites))
            # The suspect's own update is never used: the next step syncs from golden again.
            result.suspect_loss = run_step(w, step, clock, update=False)
        result.faults = faults
        return result

    def _emulator(self, w: Workload, clock: StepClock, sink: Callable[[str, dict[str, Any]], None]) -> FaultEmulator:
        """The suspect's fault emulator on ``w``, drawing by ``clock``."""
        assert self.suspect.profile is not None
        return FaultEmulator(
            self.suspect.profile,
            w.model,
            clock=lambda: (clock.step_index, clock.microbatch_index),
            sink=sink,
            seed=self.suspect.fault_seed,
            sites=self.golden.site_names,
        )

    def _trial_step(self, w: Workload, step: int, summary: ReplaySummary) -> StepResult | None:
        """One rank: run ``step`` as the golden re-execution with the suspect's emulator on. It starts from the
        golden parameters and the step's RNG state: it is the parameter-synced suspect step. Nothing fired and
        every fingerprint matched: that one execution was both sides'. Otherwise the trial is undone (no update,
        the RNG as before). In param-sync, when a fault fired, it keeps the suspect's loss, clipped gradients and
        fault events, written as `_suspect_step` writes them; the golden step runs once, and the gradients are
        compared. None: a lockstep trial fired (its suspect needs the golden site tensors while it runs), or a
        fingerprint differed with no fault; the step runs as golden + suspect (whose golden step then says why)."""
        trial = _Trial(StepClock(step), RngState())
        kept = self._golden_step(
            w, step, keep=True, summary=summary, trial=(self._emulator(w, trial.clock, trial.sink), trial)
        )
        if kept is not None:
            return self._identical_to_golden(step, *kept)
        if not trial.events or self.mode == "lockstep":
            return None
        assert self._log is not None
        for kind, fields in trial.events:
            self._log.write_event(EventRecord(kind, step, fields))
        if (captured := self._captured(w, step, trial)) is not None:
            golden, golden_loss = captured
            assert trial.after is not None
            trial.after.restore()  # the golden step's forward and backward draw what the trial's drew
            self._golden_update(w, step, golden, summary)
        else:
            golden, golden_loss = self._golden_kept(w, step, summary)
            if self.golden_from != "reexec":
                self._substitute_blobs(step, golden)
        result = StepResult(step, golden_loss, trial.loss, faults=trial.faults)
        self._gradient_noise(step, golden, result, trial.gradients)
        return result

    def _captured(self, w: Workload, step: int, trial: _Trial) -> tuple[dict[Key, torch.Tensor], float] | None:
        """The golden step's gradients and loss from the golden run's log, when it captured every parameter
        gradient the trial had (`--capture-steps`; not with ``--golden-from reexec``): what a re-execution would
        give, bit for bit (the gradients as the update read them, the loss from the microbatches' ``loss`` events
        combined as `run_step` combines them). One rank only: the trial is."""
        keys = [index_key(step, 0, name, Phase.GRAD) for name in trial.gradients]
        if self.golden_from == "reexec" or not keys or any(k not in self.golden.blobs for k in keys):
            return None
        losses = self.golden.losses.get(step, [])
        if [mb for mb, _ in losses] != list(range(trial.clock.microbatch_index + 1)):
            return None  # not one loss per microbatch, in order (a guard's re-runs log theirs too): re-execute
        store = BlobStore(self.golden.path)
        golden = {key: store.get(self.golden.blobs[key]) for key in keys}
        return golden, w.step_loss([loss for _, loss in losses])

    def _golden_update(self, w: Workload, step: int, golden: dict[Key, torch.Tensor], summary: ReplaySummary) -> None:
        """The golden step's update from its captured gradients, without running the step. A Tracer checks the
        gradients and the updated parameters against the golden log, so the update is verified bit for bit."""
        sink = VerifyingSink(self.golden.expected)
        tracer = self._verifying_tracer(w, sink)
        tracer.keep(None, set())
        grads = {key[2]: tensor for key, tensor in golden.items()}
        with tracer, tracer.step(step):
            for name, p in named_parameters(w.model):
                p.grad = grads[name].clone() if name in grads else None
            w.update(step)
        summary.checked += sink.checked
        self._verified(w, step, sink)

    def _identical_to_golden(self, step: int, golden: dict[Key, torch.Tensor], loss: float) -> StepResult:
        """The results of a suspect execution that is the golden one: what `_suspect_step` and the comparisons
        would write for bit-identical tensors, without running the step again."""
        if self.golden_from != "reexec":
            self._substitute_blobs(step, golden)  # equal to the re-execution's bits; `blobs` insists on them
        result = StepResult(step, loss, loss)
        if self.mode == "param-sync":
            self._gradient_noise(step, golden, result)
            return result
        for (_, mb, site, phase), tensor in golden.items():
            if phase in (Phase.FORWARD, Phase.BACKWARD) and compared_in_lockstep(site):
                self._site(step, mb, site, phase, Mismatch(tensor.numel(), 0, 0.0, None, 0.0, 0), result=result)
        return result

    def _gradient_noise(
        self,
        step: int,
        golden: dict[Key, torch.Tensor],
        result: StepResult,
        grads: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Compare the suspect's clipped gradients ``grads`` (None: the golden ones, for a suspect execution that
        was the golden one) with the golden ones."""
        assert self._log is not None
        golden_grads = {k[2]: t for k, t in golden.items() if k[3] == Phase.GRAD}
        grads = golden_grads if grads is None else grads
        with own_ops():
            noises = gradient_noise(grads, golden_grads)
            noises = whole_model_noise(noises, self.golden.header.extra, self.golden.header.world_size)
        for noise in noises:
            self._log.write_event(EventRecord("grad_noise", step, noise.fields()))
            if noise.name == TOTAL:
                result.noise = noise.ratio

    def _site(self, step: int, mb: int, site: str, phase: Phase, m: Mismatch, *, result: StepResult) -> None:
        assert self._log is not None
        fields = {"microbatch": mb, "site": site, "phase": phase.name.lower(), **m.fields()}
        self._log.write_event(EventRecord("site_mismatch", step, fields))
        result.worst_frequency = max(result.worst_frequency, m.frequency)
