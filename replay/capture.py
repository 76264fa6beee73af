"""Capture one site's forward at a divergence: its inputs, parameters, RNG state, aten ops and outputs.

    site = SiteKey.parse("3:0:layers.1.feed_forward:forward")    # or first_divergence(golden, suspect_run)
    captured = capture(golden, suspect, site)                    # a `Captured`; replay/bundle_files.py writes it

The golden state at ``site.step`` is rebuilt as the `Replayer` rebuilds it (replay/replayer.py): from the
nearest checkpoint, re-executing every step before it with each fingerprint checked against the golden log
(`replay.golden.VerifyingSink`), the RNG restored at step starts where the log stored it. During the golden
re-execution of ``site.step`` the site's forward in ``site.microbatch`` runs under an `OpRecorder` (its aten ops),
after its inputs, parameters and the torch RNG state were kept. Then the suspect runs the step in lockstep (every
site's output replaced by the golden one, replay/injection.py), under its fault emulator when it is an emulated
node, from the same parameters and RNG state, and its output of the site is kept: the site computed on golden
inputs, so its own error is what differs. Forward sites of single-rank runs only: a backward site's ops run in
the autograd engine, outside any module call, and a ``--at ...:backward`` is refused saying so.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from faults import FaultEmulator
from replay.bundle_check import same_bits
from replay.bundle_ops import GeneratorSeeds, OpRecorder, draw_afresh
from replay.bundle_reproduce import flatten
from replay.golden import GoldenMismatch, GoldenRun, KeepingTracer, Key, VerifyingSink, index_key, workload_entry
from replay.injection import StepClock, lockstep_hooks, lockstep_receives, sync_parameters
from replay.request import Suspect
from tracer.blobs import BlobStore
from tracer.checkpoint import restore_step_checkpoint
from tracer.collectives import observing, unobserved
from tracer.compare import compare_runs
from tracer.errors import UsageError, ValidationError
from tracer.guard.runtime import RngState
from tracer.intercept import own_ops
from tracer.log.records import Phase, RunHeader
from tracer.options import RunInfo
from tracer.parallel import pipeline_of
from tracer.rng import recorded_rng
from tracer.sites import named_modules, sites_named
from workload.protocol import Workload, build_workload, run_step


@dataclass(frozen=True)
class SiteKey:
    """Where an incident happened: a step, a microbatch, a site and a phase."""

    step: int
    microbatch: int
    name: str
    phase: Phase

    @classmethod
    def parse(cls, text: str) -> SiteKey:
        """``STEP:MB:SITE:PHASE``, e.g. ``3:0:layers.1.feed_forward:forward``."""
        parts = text.split(":")
        phases = {p.name.lower(): p for p in (Phase.FORWARD, Phase.BACKWARD)}
        if len(parts) < 4 or not parts[0].isdigit() or not parts[1].isdigit() or parts[-1] not in phases:
            raise UsageError(
                f"--at {text!r}: expected STEP:MB:SITE:PHASE with PHASE forward or backward, "
                "e.g. 3:0:layers.1.feed_forward:forward"
            )
        return cls(int(parts[0]), int(parts[1]), ":".join(parts[2:-1]), phases[parts[-1]])

    def describe(self) -> str:
        return f"step {self.step}, microbatch {self.microbatch}, {self.phase.name.lower()} {self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "microbatch": self.microbatch, "name": self.name, "phase": self.phase.name.lower()}


def first_divergence(golden: Path, suspect: Path) -> SiteKey:
    """The pair's first divergence (`tracer.compare.compare_runs`, as ``sdc verify-determinism`` finds it)."""
    found = compare_runs(golden, suspect).first
    if found is None:
        raise ValidationError(f"{golden} and {suspect} do not diverge: there is no incident to capture")
    if found.phase not in (Phase.FORWARD, Phase.BACKWARD):
        raise ValidationError(
            f"the first divergence is at {found.describe()}, which is no site's forward or backward; "
            "pass --at STEP:MB:SITE:forward naming a site"
        )
    return SiteKey(found.step, found.microbatch, found.name, found.phase)


def require_capturable(path: Path, header: RunHeader) -> None:
    """Refuse a multi-rank run that is not pipeline-parallel: where a site's forward runs on several ranks at once
    (tensor or data parallel), one rank's capture is not the site's."""
    if header.world_size != 1 and pipeline_of(header.extra) is None:
        raise UsageError(
            f"{path}: recorded on {header.world_size} ranks; incident capture replays single-rank runs and "
            "pipeline stages only"
        )


def require_forward(site: SiteKey) -> None:
    """Refuse a site that is not a forward: what `capture` supports."""
    if site.phase != Phase.FORWARD:
        raise UsageError(
            f"--at ...:{site.phase.name.lower()}: incident capture supports forward sites only; a "
            "backward site's ops run in the autograd engine, outside the module call it records. "
            f"Capture the forward of {site.name} (--at {site.step}:{site.microbatch}:{site.name}:forward)"
        )


@dataclass
class Captured:
    """One site's forward, golden and suspect, as the bundle writes it."""

    site: SiteKey
    checkpoint: int  # the golden checkpoint the state was rebuilt from
    device: str
    module: str  # the site module's class
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # "input.0", "input.<keyword>"
    named: dict[str, torch.Tensor] = field(default_factory=dict)  # "param.<name>", "buffer.<name>"
    rng: torch.Tensor | None = None  # the global torch RNG as the site's forward began
    ops: list[dict[str, Any]] = field(default_factory=list)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)  # the references of the site's output tensors
    golden: list[torch.Tensor] = field(default_factory=list)
    suspect: list[torch.Tensor] = field(default_factory=list)
    suspect_inputs_golden: bool = True  # the suspect's site saw the golden inputs bit for bit
    faults: list[dict[str, Any]] = field(default_factory=list)  # the emulator's fault events at the site
    suspect_source: str = "emulated"  # or "this machine": no emulated fault, the suspect's bits are this machine's
    logged: int | None = None  # the golden log's fingerprint of the site there
    golden_matched_log: bool = True  # False: golden's re-execution of the site itself differed from its log here
    golden_differed_after: str = ""  # the first tensor after the site whose re-execution differed from golden's log
    seeds: list[int] = field(default_factory=list)  # initial seeds of the model's own generators its ops drew from
    drawn_afresh: int = 0  # own-generator arguments seeded differently by golden and suspect: drawn anew per run


def capture(golden_path: Path, suspect: Suspect, site: SiteKey, workload: str | None = None) -> Captured | None:
    """Rebuild the golden state at ``site.step``, capture the site's forward, run the suspect's in lockstep.

    A pipeline-parallel run is captured by every stage together, each a launched rank (jobs/incident.py): each
    rebuilds its own stage and runs the golden and the suspect schedule, and the stage that holds the site captures
    it; the others return None."""
    require_forward(site)
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if dist else 0
    golden = GoldenRun.open(golden_path, site.step, site.step + 1, rank)
    require_capturable(golden_path, golden.header)
    if site.step > golden.last_step:
        raise ValidationError(f"{golden_path}: step {site.step} is beyond the recorded steps 0..{golden.last_step}")
    entry = workload_entry(golden, workload)
    golden_w, suspect_w = (build_workload(entry, golden.header.config, torch.device("cpu")) for _ in range(2))
    restore_step_checkpoint(
        golden.path, golden.start_checkpoint, rank, golden_w.model, golden_w.optimizer, golden_w.states()
    )
    path = re.sub(r"\[.*\]$", "", site.name)
    # None: another stage's site (a pipeline); this stage runs the same steps, which its sends and receives need.
    out: Captured | None = None
    record: Callable[[KeepingTracer], AbstractContextManager[None]] | None = None
    if golden.header.world_size == 1 or path in dict(named_modules(golden_w.model)):
        module = _module(golden_w.model, path)
        out = Captured(
            site,
            golden.start_checkpoint,
            str(next(golden_w.model.parameters()).device),
            type(module).__name__,
            logged=golden.expected.get(index_key(site.step, site.microbatch, site.name, Phase.FORWARD)),
        )
        record = functools.partial(_recording, module, site, out)
    for step in range(golden.start_checkpoint, site.step):
        _require_matched(_golden_step(golden, golden_w, step).mismatches)

    def suspect_step(kept: dict[Key, torch.Tensor]) -> None:
        sync_parameters(golden_w.model, suspect_w.model)
        _suspect_step(suspect, suspect_w, site, golden.site_names, kept, out)

    key = index_key(site.step, site.microbatch, site.name, site.phase)
    sink = _golden_step(
        golden,
        golden_w,
        site.step,
        between=suspect_step,
        record=record,
        watch=key,
    )
    if out is None:
        _require_matched(sink.mismatches)
        return None
    if not out.golden:
        raise ValidationError(
            f"{golden_path}: {site.describe()} never ran in the re-execution (a microbatch or site "
            "the step does not have?)"
        )
    # What differed before the site changed what the bundle would hold: refused. The site itself: this machine
    # computed it otherwise (what differs after it follows from it), and the bundle shows whether that repeats.
    # After a site that matched: the bundle holds nothing of it (what the site read and golden's output came
    # first), so it is named, not refused.
    at = sink.watched_at if sink.watched_at is not None else sink.checked + 1
    _require_matched([m for m in sink.mismatches if m.position < at])
    out.golden_matched_log = not any(m.position == at for m in sink.mismatches)
    after = [m for m in sink.mismatches if m.position > at]
    out.golden_differed_after = after[0].describe() if after and out.golden_matched_log else ""
    return out


def _module(model: nn.Module, path: str) -> nn.Module:
    found = dict(named_modules(model)).get(path)
    if found is None:
        raise ValidationError(f"the workload's model has no module {path!r}; pass --at naming a traced site")
    return found


def _golden_step(
    golden: GoldenRun,
    w: Workload,
    step: int,
    between: Callable[[dict[Key, torch.Tensor]], None] | None = None,
    record: Callable[[KeepingTracer], AbstractContextManager[None]] | None = None,
    watch: Key | None = None,
) -> VerifyingSink:
    """Re-execute ``step`` with every fingerprint checked; the sink holds what differed from the log, in the order
    traced, and the position of ``watch``. ``between`` runs the suspect after the golden forward and backward, on
    the golden tensors, from the step's starting RNG state (as the `Replayer` does)."""
    fields = golden.rng.get(step)
    if fields is not None and fields["stored"]:
        recorded_rng(BlobStore(golden.path), fields).restore()
    start = RngState()
    sink = VerifyingSink(golden.expected, watch)
    kept: dict[Key, torch.Tensor] = {}
    tracer = KeepingTracer(
        w.model,
        w.optimizer,
        sink=sink,
        run=RunInfo("golden-reexecution", config=golden.header.config),
        options=golden.site_options(w.model),
        parallel=w.layout,
    )
    tracer.keep(kept if between is not None else None, {Phase.GRAD, Phase.FORWARD, Phase.BACKWARD})
    with tracer, tracer.step(step):
        with record(tracer) if record is not None else nullcontext():
            run_step(w, step, tracer, update=False)
        if between is not None:
            with unobserved():
                after = RngState()
                start.restore()
                between(kept)
                after.restore()
        else:
            w.update(step)
    return sink


def _require_matched(mismatches: list[GoldenMismatch]) -> None:
    if mismatches:
        raise ValidationError(
            f"re-executing the golden run on this machine diverged from its log at "
            f"{mismatches[0].describe()}: its state at the incident cannot be rebuilt here "
            "(`sdc replay` of that step names likely causes)"
        )


@contextmanager
def _recording(module: nn.Module, site: SiteKey, out: Captured, tracer: KeepingTracer) -> Iterator[None]:
    """Record ``module``'s forward in the site's microbatch into ``out`` (the Tracer says which microbatch runs)."""
    recorder: list[OpRecorder] = []
    stack: list[str] = []  # the submodules of the site running now

    def enter(path: str) -> Callable[..., None]:
        return lambda *hook_args: stack.append(path)

    def leave(*hook_args: Any) -> None:  # returns None: a forward hook's result would replace the output
        stack.pop()

    def before(m: nn.Module, args: tuple, kwargs: dict) -> None:
        if recorder or tracer.microbatch_index != site.microbatch:
            return
        live = _named_inputs(args, kwargs)
        named = {f"param.{n}": p for n, p in m.named_parameters()} | {f"buffer.{n}": b for n, b in m.named_buffers()}
        with own_ops():
            out.inputs = {k: t.detach().clone() for k, t in live.items()}
            out.named = {k: t.detach().clone() for k, t in named.items()}
            out.rng = torch.get_rng_state()
        recorder.append(OpRecorder(live, named, lambda: stack[-1] if stack else ""))
        recorder[0].__enter__()

    def after(m: nn.Module, args: tuple, output: Any) -> None:
        if not recorder or out.golden:
            return
        rec = recorder[0]
        rec.__exit__(None, None, None)
        tensors = [t for t in flatten(output) if isinstance(t, torch.Tensor)]
        out.ops, out.constants, out.outputs = rec.ops, rec.constants, rec.output_refs(tensors)
        out.seeds = rec.seeds
        with own_ops():
            out.golden = [t.detach().clone() for t in tensors]

    handles = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, prepend=True),
    ]
    for path, sub in module.named_modules():
        if path:
            handles += [sub.register_forward_pre_hook(enter(path)), sub.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        if recorder and not out.golden:
            recorder[0].__exit__(None, None, None)  # the forward raised


def _suspect_step(
    suspect: Suspect,
    w: Workload,
    site: SiteKey,
    sites: tuple[str, ...],
    golden: dict[Key, torch.Tensor],
    out: Captured | None,
) -> None:
    """The suspect's step in lockstep; keeps its output of the site (before lockstep puts the golden one back) in
    ``out`` (None: a pipeline stage that does not hold the site, which only runs along)."""
    clock = StepClock(site.step)
    path = re.sub(r"\[.*\]$", "", site.name)
    seen: dict[str, Any] = {}
    seeds, watching = GeneratorSeeds(), list[bool]()  # the seeds of the suspect's site forward, while `watching`

    def stop_watching() -> None:
        if watching:
            watching.clear()
            seeds.__exit__(None, None, None)

    def before(m: nn.Module, args: tuple, kwargs: dict) -> None:
        if clock.microbatch_index == site.microbatch and "inputs" not in seen:
            with own_ops():
                seen["inputs"] = {k: t.detach().clone() for k, t in _named_inputs(args, kwargs).items()}
            seeds.__enter__()
            watching.append(True)

    def after(m: nn.Module, args: tuple, output: Any) -> None:
        if clock.microbatch_index == site.microbatch and "outputs" not in seen:
            stop_watching()
            with own_ops():
                seen["outputs"] = [t.detach().clone() for t in flatten(output) if isinstance(t, torch.Tensor)]

    def sink(kind: str, fields: dict[str, Any]) -> None:
        if (
            out is not None
            and kind == "fault"
            and fields.get("microbatch") == site.microbatch
            and f"{fields.get('site')}.".startswith(path + ".")
        ):
            out.faults.append(fields)

    with ExitStack() as stack:
        # Outside the emulator, as the Replayer's: what a pipeline stage receives is golden's too.
        stack.enter_context(observing(lockstep_receives(golden, clock, lambda *report: None)))
        if suspect.profile is not None:
            stack.enter_context(
                FaultEmulator(
                    suspect.profile,
                    w.model,
                    clock=lambda: (clock.step_index, clock.microbatch_index),
                    sink=sink,
                    seed=suspect.fault_seed,
                    sites=sites,
                )
            )
        stack.enter_context(lockstep_hooks(sites_named(w.model, sites), golden, clock, lambda *report: None))
        if out is not None:
            module = _module(w.model, path)
            stack.callback(module.register_forward_pre_hook(before, with_kwargs=True).remove)
            stack.callback(module.register_forward_hook(after, prepend=True).remove)
            stack.callback(stop_watching)  # first, should the forward raise
        run_step(w, site.step, clock, update=False)
    if out is None:
        return
    if suspect.profile is None:
        out.suspect_source = "this machine"
    if out.seeds and seeds.seeds != out.seeds:  # the model seeds its own generator anew on each run
        out.drawn_afresh = draw_afresh(out.ops, out.constants)
    out.suspect = seen.get("outputs", [])
    theirs = seen.get("inputs", {})
    out.suspect_inputs_golden = theirs.keys() == out.inputs.keys() and all(
        same_bits(t, out.inputs[k]) for k, t in theirs.items()
    )


def _named_inputs(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    named = {f"input.{i}": t for i, t in enumerate(a for a in flatten(list(args)) if isinstance(a, torch.Tensor))}
    for key, value in kwargs.items():
        for i, t in enumerate(v for v in flatten([value]) if isinstance(v, torch.Tensor)):
            named[f"input.{key}" + (f".{i}" if i else "")] = t
    return named
