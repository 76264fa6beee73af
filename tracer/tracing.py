"""`Tracer`: fingerprint a training loop's sites, gradients and parameters into a run.

Works on any ``nn.Module`` and ``torch.optim.Optimizer``::

    with Tracer(model, optimizer, out="runs/a", run=RunInfo("node-7", config=cfg)) as tr:
        for step in range(steps):
            with tr.step(step):
                for mb, (x, y) in enumerate(microbatches):
                    tr.microbatch(mb, inputs=x)
                    loss = loss_fn(model(x), y) / len(microbatches)
                    loss.backward()
                    tr.loss(loss)
                optimizer.step()
                optimizer.zero_grad()

Hooks record each site's forward output and the gradient w.r.t. its input, whatever
the site's calling convention (`tracer.site_hooks` says which tensors those are);
optimizer hooks record every gradient before the step and every parameter after
it; collectives that report to `tracer.collectives` have their input and output
recorded. Under ``torch.distributed`` each rank writes its own log (``rank-NNNNN``)
and its header (`tracer.header`) records the parallel layout (`tracer.parallel.Layout`).
Digests are computed inside the hook (no tensor is kept alive); inside a step, the records
of CPU tensors and the loss events wait in a `tracer.record_buffer.RecordBuffer` until the
step ends, outside the passes' hot loops. Records are framed in memory and written by an
I/O thread (`tracer.io_thread`). Every hook is removed when the ``with`` block exits.

On a lazy device (XLA) nothing is read mid-step: digests and losses join the step's
graph, and at the step's end the Tracer marks the step (``torch_xla.sync()``, a no-op
if the loop already did) and reads all of them in one transfer (docs/xla.md).

With ``guard=`` (`tracer.guard`), detectors look at each step in the optimizer pre-hook, after
its gradients are recorded, and a flagged step is run again (``tr.step(step, rerun=fn)``, or
the optimizer step's closure) before the optimizer may use it (`tracer.guard.step_check`); the
step's records are held in memory until then, so the log holds the run that training used
(docs/guard.md).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from tracer.blobs import BlobStore
from tracer.checkpoint import Stateful, save_step_checkpoint
from tracer.collectives import Stage, observing, record_name
from tracer.errors import CaptureError, ConfigError, TraceWarning
from tracer.fingerprint import TensorDigest, prepare_digests
from tracer.guard.guard import Guard
from tracer.guard.step_check import Attempt, check_step, step_guard, step_loss
from tracer.header import run_header, with_sites_without_backward
from tracer.intercept import own_ops, workload_ops
from tracer.io_thread import IOThread
from tracer.log.records import MAX_STEP, NO_MICROBATCH, EventRecord, Phase, RunHeader, checked_index
from tracer.log.runlock import RunLock
from tracer.log.sessions import Resumption
from tracer.optimizer_tensors import optimizer_gradients, optimizer_parameters
from tracer.options import RunInfo, TraceOptions
from tracer.parallel import Layout
from tracer.rank_log import close_rank_log, open_rank_log
from tracer.record_buffer import RecordBuffer, RecordSink
from tracer.rng import StepRng
from tracer.site_hooks import SiteHooks
from tracer.sites import find_sites, named_parameters, no_default_sites, sites_said
from tracer.torch_internals import in_backward


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr)


class Tracer:
    """Record fingerprints of one training process into ``out/rank-NNNNN``.

    ``run`` names the run (`RunInfo`), ``options`` say what to record (`TraceOptions`;
    the default records everything). With ``sink`` instead of ``out``, records go to
    that sink (no files are written): replay uses this to check a re-execution against
    a recorded log. ``parallel`` is the rank layout of a multi-rank run. ``guard`` checks each
    step before the optimizer uses it and re-runs a flagged one (`tracer.guard.Guard`). ``echo`` is told
    the traced sites once, when rank 0 starts writing a run (default: stderr; None: nothing). ``resume``
    continues this rank's crashed log in ``out`` instead of starting one (`tracer.log.resume`).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        run: RunInfo,
        out: str | Path | None = None,
        options: TraceOptions | None = None,
        sink: RecordSink | None = None,
        parallel: Layout | None = None,
        guard: Guard | None = None,
        echo: Callable[[str], None] | None = _to_stderr,
        resume: Resumption | None = None,
    ) -> None:
        if (out is None) == (sink is None):
            raise CaptureError("give the Tracer exactly one of out (a run directory) or sink")
        if not isinstance(run, RunInfo):
            found = type(run).__name__  # type: ignore[unreachable]  # a caller without a type checker may pass anything
            raise ConfigError(f'Tracer(run=...) takes a RunInfo, found {found}; e.g. run=RunInfo("node-7")')
        self.model = model
        self.optimizer = optimizer
        self.out = Path(out) if out is not None else None
        self._sink = sink
        self.run_info = run
        self.options = options = options or TraceOptions()
        self.sites = find_sites(model, options.sites) if options.activations else []  # matched once, here
        self.site_names = tuple(n for n, _ in self.sites)  # what the fault emulator and ABFT checker are given
        if options.activations and options.sites is None and not self.sites:
            raise ConfigError(no_default_sites(model))
        self.capture = options.capture
        self.blobs = BlobStore(self.out) if self.out is not None else None
        self._rng = StepRng(self.blobs) if self.blobs is not None else None  # `rng` events (tracer/rng.py)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self.rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            self.rank, self.world_size = 0, 1
        self.layout = parallel or Layout(dp=self.world_size)
        self.layout.check(self.world_size)
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        self.guard = guard
        self._guard = step_guard(guard, optimizer, options, device, self.layout, self.rank)
        self.header = run_header(
            run, model, self.sites, self.layout, rank=self.rank, world_size=self.world_size, device=device, guard=guard
        )
        self._names = {id(p): n for n, p in named_parameters(model)}
        self._handles: list[RemovableHandle] = []
        self._site_hooks: SiteHooks | None = None
        self.sites_without_backward: dict[str, str] = {}  # site -> why it records no BACKWARD
        # Telling microbatches apart: backward passes begun since the last microbatch() or step(), and
        # whether the last site record (recomputations aside) was a forward one.
        self._backward_passes = 0
        self._after_forward = False
        self._warned_microbatches = False
        self._observing: AbstractContextManager[None] | None = None
        self._io: IOThread | None = None
        self._log: RecordSink | None = None
        self.step_index = -1
        self._completed = -1  # the last step whose records all went to the log: a failure after it is in the next
        self.microbatch_index = 0
        # A gradient all-reduce ran since the last microbatch began: the step's gradients belong to no microbatch.
        self._grads_reduced = False
        self.attempt = 0  # which run of the current step: 0, or the guard's re-runs 1, 2, ...
        self._rerun: Callable[[], Any] | None = None
        self._closure_reruns = True
        self._states: Mapping[str, Stateful] | None = None  # the last checkpoint's, for the guard's stop
        self._losses: list[float] = []
        self._grad_norm: torch.Tensor | float | None = None  # before clipping, if the loop reports it
        self._lrs: list[float] = []
        self._step_start = 0.0
        # What the Tracer has taken but not written yet (`tracer.record_buffer`). A sink (replay's checker) reads
        # each record as it comes, a subclass that overrides record_many sees every record there, and a capture
        # copies the tensor as it is: none of them holds.
        self._records = RecordBuffer(lambda: self.log, self.capture, self.blobs)
        self._holds = (
            sink is None
            and type(self).record_many is Tracer.record_many
            and not (self.capture.active and self.blobs is not None)
        )
        self._paused = False
        self._echo = echo
        self._lock: RunLock | None = None
        self._resume = resume

    # -- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> Tracer:
        prepare_digests()  # the kernel and its tables are loaded here, not in the first traced step
        io = None
        try:
            if self._sink is not None:
                self._log = self._sink
            else:
                assert self.out is not None
                io, self._log, self._lock = open_rank_log(
                    self.out, self.rank, self._final_header, self.options, self._resume
                )
            self._io = self._records.io = io
            self._site_hooks = SiteHooks(
                self.sites,
                on_output=self._site_output,
                on_input_grad=self._site_input_grad,
                on_unrecordable=self._site_without_backward,
            ).__enter__()
            if self.optimizer is not None:
                if self.options.gradients:
                    self._handles.append(self.optimizer.register_step_pre_hook(self._before_optimizer_step))
                if self.options.parameters:
                    self._handles.append(self.optimizer.register_step_post_hook(self._after_optimizer_step))
            if self.options.collectives:
                self._observing = observing(self._collective)
                self._observing.__enter__()
            if self.sites and self.rank == 0 and self._sink is None and self._echo is not None:
                self._echo(
                    sites_said(
                        self.site_names,
                        defaults=self.options.sites is None,
                        wrappers=self.header.extra.get("wrappers", ()),
                    )
                )
        except BaseException:
            self._remove_hooks()
            if self._log is not None:
                self._log.abandon()
            if io is not None:
                io.stop()
            self._log = self._io = None
            self._release_lock()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._remove_hooks()
        try:
            if exc is None and self._log is not None:
                try:
                    self._records.drain()
                    self._records.read_pending()
                except BaseException as e:
                    self._close(e)
                    raise
            self._close(exc)
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _close(self, exc: BaseException | None) -> None:
        self._records.discard_pending()  # after a failure: a lazy step's graph may not run
        if exc is not None:
            with contextlib.suppress(Exception):  # the training error stays the one the user sees
                self._records.drain()  # what the failed step recorded before the failure
        self._records.discard_held()
        log, io = self._log, self._io
        self._log = self._io = self._records.io = None
        if log is not None:
            close_rank_log(log, io, exc, self._resume, self.rank, self._completed + 1)

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._site_hooks is not None:
            self._site_hooks.remove()
            self._site_hooks = None
        if self._observing is not None:
            self._observing.__exit__(None, None, None)
            self._observing = None

    @property
    def parameter_names(self) -> frozenset[str]:
        """The names the model's parameters are recorded under."""
        return frozenset(self._names.values())

    @property
    def log(self) -> RecordSink:
        if self._log is None:
            raise CaptureError("the Tracer is not active; use it as `with Tracer(...) as tracer:`")
        return self._log

    def sync(self) -> None:
        """Block until everything recorded so far has reached the OS."""
        self._records.drain()
        self._records.read_pending()
        self.log.flush()
        if self._io is not None:
            self._io.drain()

    # -- what the training loop calls ---------------------------------------------------
    @contextmanager
    def step(self, step: int, rerun: Callable[[], Any] | None = None, *, closure_reruns: bool = True) -> Iterator[None]:
        """Bracket one optimizer step; its wall time, losses and learning rates are logged.

        With a guard, ``rerun`` runs the step's forward and backward again on the same data: it zeroes the
        gradients and repeats the step's `microbatch` and `loss` calls (`rerun_with` sets it later). Without
        it, an optimizer step given a closure re-runs through the closure, unless ``closure_reruns`` is False
        (a closure that holds only the last of several accumulated microbatches)."""
        step = checked_index("step", step, MAX_STEP)
        self._records.drain()
        self.step_index = step
        self._begin_attempt(0)
        self._lrs = []
        self._step_start = time.perf_counter()
        self._rerun, self._closure_reruns = rerun, closure_reruns
        if self._rng is not None:
            self.event("rng", **self._rng.step_start())
        if self._guard is not None:
            self._log = self._guard.begin(self.log)
        if self._holds:
            self._records.start_holding()
        try:
            yield
        except BaseException:
            self._records.stop_holding()
            with contextlib.suppress(Exception):  # the training error stays the one the user sees
                self._records.drain()
            if self._guard is not None:
                self._log = self._guard.release()  # what the step recorded, as it would be without a guard
            raise
        self._records.stop_holding()
        if self._rng is not None:
            self._rng.rebuilt_here()
        self._records.drain()
        if self._guard is not None:
            self._log = self._guard.release()  # a step without an optimizer step: nothing to decide
        norm: list[float] = []
        if isinstance(self._grad_norm, torch.Tensor) and self._records.defers(self._grad_norm):
            self._records.defer([self._grad_norm.detach()], lambda host: norm.append(host[0].item()))
        self._records.read_pending()  # on an accelerator, the step's one transfer: the norm rides along
        log = self.log
        wall = time.perf_counter() - self._step_start
        lrs = self._lrs or ([float(g["lr"]) for g in self.optimizer.param_groups] if self.optimizer else [])
        fields: dict[str, Any] = {
            "loss": sum(self._losses) if self._losses else None,
            "lr": lrs,
            "wall_s": wall,
            "microbatches": len(self._losses),
        }
        if norm:  # the accepted run's norm before clipping: offline detectors read it
            fields["grad_norm"] = norm[0]
        elif self._grad_norm is not None:
            with own_ops():
                fields["grad_norm"] = float(self._grad_norm)
        log.write_event(EventRecord("step", step, fields))
        # Hand the step's records to the I/O thread: a crash loses at most the current step.
        log.flush()
        self._completed = step

    def rerun_with(self, rerun: Callable[[], Any]) -> None:
        """How the guard may run the current step's forward and backward again (`step`'s ``rerun``)."""
        self._rerun = rerun

    def gradient_norm(self, norm: torch.Tensor | float) -> None:
        """Report the step's global gradient norm before clipping (what ``clip_grad_norm_`` returns): the
        guard's `GradNormSpike` watches it, since the clipped gradients the Tracer records hide a spike."""
        self._grad_norm = norm

    def _begin_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self.microbatch_index = 0
        self._grads_reduced = False
        self._backward_passes = 0
        self._after_forward = False
        self._losses = []
        self._grad_norm = None

    def microbatch(self, index: int, inputs: torch.Tensor | tuple[torch.Tensor, ...] | None = None) -> None:
        """Start microbatch ``index`` (gradient accumulation) and fingerprint its inputs."""
        index = checked_index("microbatch", index, NO_MICROBATCH - 1)
        self.microbatch_index = index
        self._grads_reduced = False
        self._backward_passes = 0
        if inputs is None:
            return
        tensors = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        for i, t in enumerate(tensors):
            self.record("input" if i == 0 else f"input[{i}]", t, Phase.INPUT)

    def loss(self, value: torch.Tensor | float) -> None:
        """Log this microbatch's loss (as it contributes to the step: already scaled)."""
        step, mb = self.step_index, self.microbatch_index
        if isinstance(value, torch.Tensor) and self._records.defers(value):
            self._records.drain()
            log = self.log

            def write(v: float) -> None:
                self._losses.append(v)
                log.write_event(EventRecord("loss", step, {"microbatch": mb, "loss": v}))

            self._records.defer([value.detach().reshape(1)], lambda host: write(host[0].item()))
            return
        v = float(value.detach().item() if isinstance(value, torch.Tensor) else value)
        self._losses.append(v)
        self._records.hold_event(EventRecord("loss", step, {"microbatch": mb, "loss": v}))

    def restored(self) -> None:
        """Training state was just restored from one of this run's checkpoints (a resumed recording): the global
        RNG is what a replay from that checkpoint has, so the next step's ``rng`` event need not store it."""
        if self._rng is not None:
            self._rng.rebuilt_here()

    def checkpoint(
        self, step: int, data: Mapping[str, Any] | None = None, states: Mapping[str, Stateful] | None = None
    ) -> Path:
        """Save the state before ``step`` for replay: model, optimizer, RNG, the data cursor ``data``, and
        the ``state_dict`` of every object in ``states`` (an LR scheduler, a sampler), by name."""
        if self.out is None:
            raise CaptureError("this Tracer writes to a sink, not a run directory: it cannot checkpoint")
        self._records.drain()
        self._records.read_pending()
        self._states = states
        with self.paused(), own_ops():  # a sharded checkpoint may step the optimizer at lr 0 to create its state
            path = save_step_checkpoint(self.out, step, self.rank, self.model, self.optimizer, dict(data or {}), states)
        if self._rng is not None:
            self._rng.rebuilt_here()
        self.log.write_event(EventRecord("checkpoint", step, {"rank": self.rank}))
        return path

    def event(self, kind: str, /, *, at_step: int | None = None, **fields: Any) -> None:
        """Log a custom event at the current step, or at ``at_step``."""
        self._records.write_event(EventRecord(kind, self.step_index if at_step is None else at_step, fields))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the forward and backward passes and optimizer steps inside unrecorded: work on the model that is
        not a training step, such as an evaluation between steps."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def record(self, name: str, tensor: torch.Tensor, phase: Phase, microbatch: int | None = None) -> None:
        """Fingerprint one tensor at the current step and microbatch (and capture it if asked)."""
        mb = self.microbatch_index if microbatch is None else microbatch
        if not self._records.hold(self.step_index, mb, name, phase, tensor):
            self.record_many([(name, tensor)], phase, microbatch)

    def record_many(
        self,
        named: list[tuple[str, torch.Tensor]],
        phase: Phase,
        microbatch: int | None = None,
        *,
        read_now: bool = False,
    ) -> list[TensorDigest] | None:
        """`record` for many tensors of one phase: one digest call for all of them (a step's gradients, its
        parameters), which is what keeps per-tensor overhead out of the step. Returns the digests; None on an
        accelerator, whose digests are read at the step's end unless ``read_now`` (the guard needs them
        before the optimizer step)."""
        mb = self.microbatch_index if microbatch is None else microbatch
        return self._records.write_many(named, phase, self.step_index, mb, read_now=read_now)

    # -- hooks -------------------------------------------------------------------------
    def _site_output(self, name: str, output: torch.Tensor) -> None:
        if self._paused:
            return
        if not self._after_forward and not in_backward():  # checkpointing recomputes forwards in the backward pass
            self._after_forward = True
        self.record(name, output, Phase.FORWARD)

    def _site_input_grad(self, name: str, grad: torch.Tensor) -> None:
        if self._paused:
            return
        if self._after_forward:  # a backward pass begins
            self._after_forward = False
            self._backward_passes += 1
            if self._backward_passes == 2 and not self._warned_microbatches:
                self._warned_microbatches = True
                warnings.warn(
                    f"step {self.step_index}: a second backward pass began without tracer.microbatch() in "
                    f"between, so both are recorded as microbatch {self.microbatch_index}; call "
                    "tracer.microbatch(i) before each microbatch's forward pass",
                    TraceWarning,
                    stacklevel=2,
                )
        self.record(name, grad, Phase.BACKWARD)

    def _site_without_backward(self, name: str, reason: str) -> None:
        self.sites_without_backward[name] = reason
        warnings.warn(
            f"site {name} records no backward (gradient) fingerprint: {reason}; "
            "choose sites whose input is a floating-point tensor (TraceOptions(sites=...)) to record one",
            TraceWarning,
            stacklevel=2,
        )

    def _final_header(self) -> RunHeader:
        """The header as the log stores it: with the sites that turned out to give no input gradient."""
        self.header = with_sites_without_backward(self.header, self.sites_without_backward)
        return self.header

    def _collective(self, point: str, op: str, phase: Phase, stage: Stage, tensor: torch.Tensor) -> None:
        if self._paused:
            return
        if phase == Phase.GRAD:  # a gradient collective completes the step's gradients after its microbatches
            self._grads_reduced = True
        self.record(
            record_name(point, op, stage), tensor, phase, microbatch=NO_MICROBATCH if phase == Phase.GRAD else None
        )

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if self._paused:
            return None
        self._lrs = [float(g["lr"]) for g in optimizer.param_groups]
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0] is the optimizer
        if closure is None:
            grads = self._record_gradients(optimizer)
            if self._guard is not None and self._guard.pending:
                self._check_step(optimizer, grads, self._rerun)
            return None

        # A step with a closure (Lightning, LBFGS) computes the gradients inside the step, and a framework may
        # clip them there too: record them when the closure returns, i.e. what the update itself reads.
        def traced() -> Any:
            guard = self._guard
            checks = guard is not None and guard.pending
            if guard is not None and checks and self._rerun is None:
                self._records.drain()
                guard.mark_rerun_start()
            loss = closure()
            grads = self._record_gradients(optimizer)
            if checks:
                rerun = self._rerun or (closure if self._closure_reruns else None)
                loss = self._check_step(optimizer, grads, rerun, loss)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": traced}
        return (args[0], traced, *args[2:]), kwargs

    def _record_gradients(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, TensorDigest]]:
        grads = optimizer_gradients(optimizer, self._names)  # a DTensor's local shard: what this rank holds
        # The microbatch whose backward last changed them: the last one begun (under DDP, the one whose backward
        # ran the all-reduce), unless a gradient collective ran after it.
        mb = NO_MICROBATCH if self._grads_reduced else self.microbatch_index
        if self._guard is None and self._records.hold_many(grads, Phase.GRAD, self.step_index, mb):
            return []  # only the guard reads them
        digests = self.record_many(grads, Phase.GRAD, microbatch=mb, read_now=self._guard is not None) or []
        return [(name, d) for (name, _), d in zip(grads, digests)]

    def _check_step(
        self,
        optimizer: torch.optim.Optimizer,
        grads: list[tuple[str, TensorDigest]],
        rerun: Callable[[], Any] | None,
        result: Any = None,
    ) -> Any:
        """The guard's decision on this step (`tracer.guard.step_check`): what the accepted run's closure returned."""
        assert self._guard is not None
        first = Attempt(self.attempt, step_loss(self._losses, result), grads, result, self._grad_norm)
        return check_step(
            self._guard,
            self.step_index,
            optimizer,
            first,
            rerun,
            use_sink=self._use_sink,
            run_again=functools.partial(self._run_again, optimizer),
            checkpoint=self._stop_checkpoint,
        )

    def _use_sink(self, sink: RecordSink) -> None:
        self._log = sink

    def _run_again(self, optimizer: torch.optim.Optimizer, rerun: Callable[[], Any]) -> Attempt:
        """The guard's next run of the step: its forward and backward again, and its gradients recorded."""
        self._begin_attempt(self.attempt + 1)
        with torch.enable_grad(), workload_ops():
            out = rerun()
        grads = self._record_gradients(optimizer)
        return Attempt(self.attempt, step_loss(self._losses, out), grads, out, self._grad_norm)

    def _stop_checkpoint(self) -> str | None:
        """The checkpoint a guard's ``stop`` leaves: the state the step began from (None without a run directory)."""
        if self.out is None:
            return None
        return str(self.checkpoint(self.step_index, data={"step": self.step_index}, states=self._states))

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._paused:
            return
        params = optimizer_parameters(optimizer, self._names)
        if self._guard is not None and self._guard.replicas is not None:  # the replicas compare the digests, now
            digests = self.record_many(params, Phase.PARAM, microbatch=0, read_now=True) or []
            return self._guard.replicas.compare(self.step_index, params, digests, self.event)
        if not self._records.hold_many(params, Phase.PARAM, self.step_index, 0):
            self.record_many(params, Phase.PARAM, microbatch=0)
