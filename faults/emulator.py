"""`FaultEmulator`: play an unhealthy node by corrupting aten op results.

    emulator = FaultEmulator(load_profile("rare-huge"), model, seed=3,
                             clock=lambda: (tracer.step_index, tracer.microbatch_index),
                             sink=lambda kind, fields: tracer.event(kind, **fields))
    with emulator:
        train()          # any model, any device, no change to its code

An `Interceptor` (`tracer.intercept`): the calls of the aten ops its rules name, in
the forward and backward passes and, for a rule with the ``"optimizer"`` phase, in an
optimizer's step (the update), reach it, and a corrupted result flows on exactly as
a faulty unit's would; an in-place op's corruption lands in the tensor it wrote (for a
``_foreach_`` op, one tensor of its list; for a DTensor, this rank's shard). Each
corruption is logged as a ``fault`` event (docs/log-format.md), the ground truth
detectors are scored against. Ops no rule names never reach Python, and of the calls of those it names, a C++ gate
(faults/native.cpp) settles the ones no draw hits; sdctrace's own ops never reach it,
and plain optimizer steps only while a rule for the optimizer phase is armed (`faults.scope`).

Deterministic without touching any global RNG (that would change training): the
burst chains and the per-call draws come from private generators seeded from the
profile seed, ``seed``, and the (step, microbatch) the draw happens in, and are
advanced in op-call order. The same profile and seed give the same faults, and a
replay of one step gets that step's faults. A clock may add a third element, the
attempt: the guard's re-runs of a step (`tracer.guard`) are attempts 1, 2, ..., later
moments in time, in which a transient rule draws afresh and a ``persistent`` one
repeats attempt 0's draws.

Under torch.distributed a rule may name the ranks it applies to (one bad
accelerator in a node), and rules naming collectives corrupt what a collective
delivers, through `tracer.collectives`. A profile's ``[[state]]`` rules flip a bit
of a parameter after an optimizer update instead (`faults.state_faults`). A rule may
also name the roles of the runs it fires in (``role``: the run header's, ``"train"``
for pretraining and its replays, ``"finetune"`` for `jobs.finetune`).

With the ABFT checker, enter the emulator first: the checker, entered second,
sees each op first and calls it through the emulator, so it checks the corrupted
result as hardware-level detection would.
"""

from __future__ import annotations

import functools
import math
import random
import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from faults.corrupt import LAYOUTS, field_bits, flip_bit_sets, flip_bits, scale, stuck
from faults.ops import resolve_collectives, resolve_ops
from faults.profile import Corruption, FaultProfile, RulePhase
from faults.schedule import BurstChain
from faults.scope import ModuleScope, ScopedInterceptor, native
from faults.state_faults import StateFaults
from tracer.collectives import Stage, observing
from tracer.compiled import refuse_compiled
from tracer.errors import ConfigError, TraceWarning
from tracer.intercept import Call, Clock, NativeKernel, Sink, below_autograd, in_own_ops, own_ops
from tracer.log.records import Phase
from tracer.sharding import local_shard
from tracer.sites import find_sites, named_modules, sites_named
from tracer.torch_internals import op_is_mutable

SHOWN = 8  # values and indices a fault event lists
PREDRAWN = 1024  # draws handed to the C++ gate at a time
_OF_PHASE = {Phase.FORWARD: RulePhase.FORWARD, Phase.BACKWARD: RulePhase.BACKWARD}  # the scope's -> a rule's


def emulator_implementation() -> str:
    """Where the per-call decision runs here: "gate" (C++) or "python"; benchmarks print it."""
    return "gate" if native() is not None else "python"


class FaultEmulator(ScopedInterceptor):
    """Corrupt op results as ``profile`` says while active; log every corruption to ``sink``."""

    title = "fault emulator"

    def __init__(
        self,
        profile: FaultProfile,
        model: nn.Module,
        *,
        clock: Clock,
        sink: Sink,
        seed: int = 0,
        sites: Sequence[str] | None = None,
        role: str = "train",
        rank: int | None = None,
    ) -> None:
        super().__init__()
        refuse_compiled(model, self.title)
        self.profile = profile
        self.seed = seed
        self.role = role
        self._clock = clock
        self._sink = sink
        rules = profile.faults
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if rank is None:  # given: the rank a reproduction plays (an incident bundle captured on a pipeline stage)
            rank = torch.distributed.get_rank() if distributed else 0
        # A rule for other ranks (one bad accelerator in a node) or for runs of another role hits nothing here.
        mine = [(r.ranks is None or rank in r.ranks) and (r.roles is None or role in r.roles) for r in rules]
        self._ops = [resolve_ops(r.ops) if m else frozenset() for r, m in zip(rules, mine)]
        self._collectives = [resolve_collectives(r.ops) if m else frozenset() for r, m in zip(rules, mine)]
        self._patterns = [re.compile(r.sites) if r.sites is not None else None for r in rules]
        self._chains = [
            BurstChain(r.schedule, f"sdctrace-bursts:{profile.seed}:{seed}:{i}") for i, r in enumerate(rules)
        ]
        # The traced sites' names, as the Tracer matched them (`Tracer.site_names`); None: the model's default sites.
        traced = find_sites(model) if sites is None else sites_named(model, sites)
        self._site_names = {path for path, _ in traced}
        hooked = set(self._site_names)
        named = named_modules(model)  # the paths of the model as written: no wrapper's `module.` or `_orig_mod.`
        # Per rule with a pattern and ops here, the module paths it matches (the scope's stacks hold no others).
        self._matched: list[frozenset[str] | None] = [None] * len(rules)
        for i, pattern in enumerate(self._patterns):
            # Collectives are named by their observation point, which need not be a module.
            if pattern is None or not self._ops[i]:
                continue
            hits = self._matched[i] = frozenset(path for path, _ in named if pattern.fullmatch(path))
            if not hits:
                raise ConfigError(
                    f"{profile.path}: fault[{i}].sites = {pattern.pattern!r} matches no module path of the model "
                    f"(paths look like {', '.join(p for p, _ in named[:6])})"
                )
            hooked |= hits
        self.scope = ModuleScope([(path, m) for path, m in named if path in hooked])
        # The profile's [[state]] rules: bits of parameters flipped after an update, not results of ops.
        self._states = StateFaults(profile, model, clock=clock, sink=sink, seed=seed, rank=rank, role=role)
        self._draws_key: tuple[int, ...] | None = None
        self._clock_at: tuple[int, ...] | None = None  # the clock `_live` was decided for
        self._live: dict[RulePhase, frozenset[int]] = {}
        self._draws: dict[int, random.Random] = {}
        self._rules_of: dict[Any, tuple[int, ...]] = {}  # op overload -> the rules that name its packet
        self.ops = frozenset().union(*self._ops)
        # The rules here that may hit an optimizer step's ops: while one is armed, steps are not paused.
        self._updates = tuple(i for i, r in enumerate(rules) if self._ops[i] and RulePhase.OPTIMIZER in r.phases)
        # The C++ gate settles the calls no draw hits; it consumes draws the emulator pre-drew on a copy of the
        # generator, which catches up (`_sync`) before Python draws again.
        module = native() if 0 < len(rules) <= 64 else None
        self._gate = (
            module.Gate(
                # Nothing here may refer to the emulator: the gate is opaque to the garbage collector.
                clock,
                self.scope.forward_paths,
                functools.partial(self.scope.stack, Phase.BACKWARD),
                self.scope.optimizer_steps,
                [r.p_call for r in rules],
                self._matched,
            )
            if module
            else None
        )
        self._predrawn: random.Random | None = None  # the generator whose next draws the gate holds
        self._gated = False  # the clock armed for lets the gate draw (attempt 0)
        self._untraced: set[str] = set()  # hit modules no traced site holds, said once each

    def __enter__(self) -> FaultEmulator:
        super().__enter__()
        self._observing = observing(self._collective)
        self._observing.__enter__()
        self._states.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._states.__exit__(None, None, None)
            self._observing.__exit__(None, None, None)
        finally:
            super().__exit__(*exc)

    def _collective(self, point: str, op: str, phase: Phase, stage: Stage, tensor: torch.Tensor) -> torch.Tensor | None:
        """Corrupt what a collective delivers (its output), as a faulty link or reduction would."""
        if stage != "out" or in_own_ops():
            return None
        where = RulePhase.FORWARD if phase == Phase.FORWARD else RulePhase.BACKWARD
        step, microbatch, *attempt = self._clock()
        hit = None
        for i, rule in enumerate(self.profile.faults):
            pattern = self._patterns[i]
            armed = self._armed(i, step, microbatch, *attempt)
            if op not in self._collectives[i] or where not in rule.phases or not armed:
                continue
            if pattern is not None and not pattern.fullmatch(point):
                continue
            rng = self._draws_for(i, step, microbatch, *attempt)
            if rng.random() < rule.p_call:
                with own_ops():
                    hit = tensor.clone() if hit is None else hit
                    self._hit(i, hit, rng, point, op, where, microbatch)
        return hit

    def native_kernel(self, op: Any) -> NativeKernel | None:
        module = native()
        if self._gate is None or module is None:  # the gate is built only where the native kernel is
            return None
        gate, rules, register = self._gate, sum(1 << i for i in self._rules(op)), module.register
        return lambda name, python: register(gate, name, rules, python)

    def needs_optimizer_step(self) -> bool:
        """A rule for the optimizer phase is armed now: the step's ops must reach the emulator."""
        if not self._updates:
            return False
        clock = self._clock()
        return any(self._armed(i, *clock) for i in self._updates)

    def may_fire(self, step: int, attempt: int = 0) -> bool:
        """Some rule may corrupt a result in ``step`` (its ``attempt``): one that hits ops or collectives on this
        rank and role, with a ``p_call`` above 0, is armed there by its schedule's burst chain. Known without running
        anything; False means the step runs exactly as without the emulator (replay runs it once, `replay.replayer`)."""
        return any(
            (self._ops[i] or self._collectives[i])
            and r.p_call > 0
            and (r.attempts is None or attempt in r.attempts)
            and self._chains[i].armed(step)
            for i, r in enumerate(self.profile.faults)
        )

    def intercept(self, func: Any, args: tuple, kwargs: dict, call: Call) -> Any:
        out = call(*args, **kwargs)
        scoped = self.scope.phase()
        if scoped is not None:
            phase = _OF_PHASE[scoped]
        elif self.scope.optimizing:
            phase = RulePhase.OPTIMIZER
        else:
            return out  # gradient clipping, bookkeeping: never corrupted
        clock = self._clock()
        if clock != self._clock_at:
            self._arm(clock)
        live = self._live[phase]
        if live:
            for i in self._rules(func):
                if i in live:
                    out = self._inject(i, func, phase, clock, args, out)
        if self._gated and self._predrawn is None:
            self._predraw()
        return out

    def _rules(self, func: Any) -> tuple[int, ...]:
        """The rules that name ``func``'s packet."""
        rules = self._rules_of.get(func)
        if rules is None:
            rules = self._rules_of[func] = tuple(i for i, ops in enumerate(self._ops) if func.overloadpacket in ops)
        return rules

    def _arm(self, clock: tuple[int, ...]) -> None:
        """The rules that may fire in each phase at this (step, microbatch): decided once, not on every call."""
        self._sync()
        armed = [i for i in range(len(self.profile.faults)) if self._armed(i, *clock)]
        self._live = {p: frozenset(i for i in armed if p in self.profile.faults[i].phases) for p in RulePhase}
        self._clock_at = clock
        if self._gate is not None:
            # A guarded re-run's draws (attempt > 0) come from more than one stream: Python makes them all.
            self._gated = len(clock) < 3 or clock[2] == 0
            masks = [sum(1 << i for i in self._live[p]) for p in RulePhase]
            self._gate.arm(clock if self._gated else None, *masks)

    def _predraw(self) -> None:
        """Hand the gate the next draws of attempt 0's generator at the armed clock, drawn on a copy."""
        gate, clock = self._gate, self._clock_at
        assert gate is not None and clock is not None, "only a gate armed at a clock pre-draws"
        rng = self._stream(0, clock[0], clock[1], 0)
        copy = random.Random()
        copy.setstate(rng.getstate())
        gate.fill([copy.random() for _ in range(PREDRAWN)])
        self._predrawn = rng

    def _sync(self) -> None:
        """Advance the generator past the draws the gate consumed, and take the rest back."""
        if self._predrawn is not None and self._gate is not None:  # only a gate pre-draws
            rng, self._predrawn = self._predrawn, None
            for _ in range(self._gate.fill([])):
                rng.random()

    def _inject(self, i: int, func: Any, phase: RulePhase, clock: tuple[int, ...], args: tuple, out: Any) -> Any:
        """Rule ``i``'s draw for this call (no tensor ops: cheap on the many calls that are not hit), then the
        corruption if it hits."""
        if self._patterns[i] is not None and self._site(i, phase) is None:
            return out  # no module around this op matches the rule's pattern (without one, a site only names a hit)
        step, microbatch, *attempt = clock
        rng = self._draws_for(i, step, microbatch, *attempt)
        if rng.random() < self.profile.faults[i].p_call:
            matched = self._site(i, phase)
            assert matched is not None, "a rule with a pattern that matched nothing returned above"
            site = self._where(matched, phase)
            with own_ops():
                out = self._corrupt(i, func, args, out, rng, site, phase, microbatch)
        return out

    def _armed(self, rule: int, step: int, microbatch: int, attempt: int = 0) -> bool:
        """The rule may fire in this step (its schedule), microbatch and attempt (its ``microbatches`` and
        ``attempts``, if any)."""
        r = self.profile.faults[rule]
        return (
            (r.microbatches is None or microbatch in r.microbatches)
            and (r.attempts is None or attempt in r.attempts)
            and self._chains[rule].armed(step)
        )

    def _site(self, rule: int, phase: RulePhase) -> str | None:
        """Deepest module on the stack the rule's pattern matches (None: rule does not apply here);
        without a pattern, the deepest traced site, or "" (always, in an optimizer step: no module runs)."""
        pattern = self._patterns[rule]
        if phase == RulePhase.OPTIMIZER:
            return "" if pattern is None else None
        for path in reversed(self.scope.stack(Phase.FORWARD if phase == RulePhase.FORWARD else Phase.BACKWARD)):
            if pattern.fullmatch(path) if pattern is not None else path in self._site_names:
                return path
        return None if pattern is not None else ""

    def _where(self, site: str, phase: RulePhase) -> str:
        """The module a hit names: the deepest traced site on the stack inside the one the rule matched (a rule on
        ``blocks.1.mlp`` hitting a matmul of a traced ``blocks.1.mlp.0`` happened in ``blocks.1.mlp.0``, and the
        diff looks for it there), else the matched module itself."""
        if not site or phase == RulePhase.OPTIMIZER:
            return site
        inside = site + "."
        for path in reversed(self.scope.stack(Phase.FORWARD if phase == RulePhase.FORWARD else Phase.BACKWARD)):
            if path == site:
                break
            if path.startswith(inside) and path in self._site_names:
                return path
        return site

    def _draws_for(self, rule: int, step: int, microbatch: int, attempt: int = 0) -> random.Random:
        self._sync()
        # Attempt 0 is one stream for every rule; a re-run replays it for persistent rules, draws anew for the rest.
        return self._stream(0 if self.profile.faults[rule].persistent else attempt, step, microbatch, attempt)

    def _stream(self, drawn: int, step: int, microbatch: int, attempt: int) -> random.Random:
        key = (step, microbatch, attempt)
        if key != self._draws_key:
            self._draws, self._draws_key = {}, key
        rng = self._draws.get(drawn)
        if rng is None:
            # A string seed is hashed with SHA-512: stable across processes and platforms.
            again = f":{drawn}" if drawn else ""
            rng = random.Random(f"sdctrace-calls:{self.profile.seed}:{self.seed}:{step}:{microbatch}{again}")
            self._draws[drawn] = rng
        return rng

    def _corrupt(
        self,
        i: int,
        func: Any,
        args: tuple,
        out: Any,
        rng: random.Random,
        site: str,
        phase: RulePhase,
        microbatch: int,
    ) -> Any:
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        candidates = [j for j, t in enumerate(outputs) if _corruptible(t)]
        if not candidates:
            if op_is_mutable(func) and args:  # an in-place `_foreach_` op returns nothing: hit what it wrote
                self._corrupt_written(i, func, args[0], rng, site, phase, microbatch)
            return out
        # Forward ops' first output is the result (the rest is saved for backward);
        # a backward op's outputs are gradients of equal standing.
        j = candidates[0] if phase == RulePhase.FORWARD or len(candidates) == 1 else rng.choice(candidates)
        target = outputs[j]
        if not op_is_mutable(func) and _aliases(target, args):
            target = target.clone()
        self._hit(i, local_shard(target), rng, site, str(func), phase, microbatch)
        if site not in self._site_names and phase != RulePhase.OPTIMIZER:
            self._say_untraced(site, str(func))
        if target is outputs[j]:
            return out
        outputs[j] = target
        return type(out)(outputs) if isinstance(out, (tuple, list)) else target

    def _corrupt_written(
        self, i: int, func: Any, written: Any, rng: random.Random, site: str, phase: RulePhase, microbatch: int
    ) -> None:
        """Corrupt what an in-place op that returns nothing wrote: its first argument (``self``), one tensor of
        it if it is a list (drawn when it holds more than one)."""
        tensors = [t for t in (written if isinstance(written, (tuple, list)) else [written]) if _corruptible(t)]
        if tensors:
            target = tensors[0] if len(tensors) == 1 else rng.choice(tensors)
            self._hit(i, local_shard(target), rng, site, str(func), phase, microbatch)

    def _hit(
        self, i: int, target: torch.Tensor, rng: random.Random, site: str, op: str, phase: RulePhase, microbatch: int
    ) -> None:
        """Corrupt elements of ``target`` in place as rule ``i`` says, and log the fault."""
        rule = self.profile.faults[i]
        n = target.numel()
        if rule.elements is not None:
            k = rule.elements
        else:
            assert rule.fraction is not None, "FaultRule sets elements where neither is given"
            k = max(1, round(rule.fraction * n))
        if rule.stride is None:
            index = sorted(rng.sample(range(n), min(k, n)))
        else:  # a periodic pattern (one lane of each warp): a drawn first element, then every stride-th
            index = list(range(rng.randrange(min(rule.stride, n)), n, rule.stride))[:k]
        flat = torch.tensor(index, device=target.device)
        coords: tuple[torch.Tensor, ...]
        with below_autograd():
            if target.is_contiguous():
                view, coords = target.view(-1), (flat,)
            else:
                view, coords = target, torch.unravel_index(flat, target.shape)
            original = view[coords]
            corrupted, detail = self._apply(i, rule.corruption, original, rng)
            view.index_put_(coords, corrupted)
        self._sink(
            "fault",
            {
                "microbatch": microbatch,
                "site": site,
                "op": op,
                "phase": phase.value,
                "kind": rule.corruption.kind,
                "elements": len(index),
                "index": index[:SHOWN],
                "original": original[:SHOWN].tolist(),
                "corrupted": corrupted[:SHOWN].tolist(),
                "detail": detail,
            },
        )

    def _say_untraced(self, site: str, op: str) -> None:
        """Warn once per module when a fault lands outside every traced site: its ``traced_site`` stays empty and
        a fingerprint diff finds it downstream, in the next traced site, not where it happened."""
        if site in self._untraced or any(site.startswith(s + ".") for s in self._site_names):
            return
        self._untraced.add(site)
        where = f"in module {site}, which no traced site holds" if site else "outside every traced site"
        warnings.warn(
            f"a fault hit {op} {where}: its traced_site stays empty and a diff "
            f"shows the divergence downstream, at the next traced site; trace it with TraceOptions(sites=...) "
            f"or sdc record --sites (traced: {len(self._site_names)} sites)",
            TraceWarning,
            stacklevel=2,
        )

    def _apply(self, i: int, c: Corruption, values: torch.Tensor, rng: random.Random) -> tuple[torch.Tensor, dict]:
        dtype = values.dtype
        detail: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch.")}
        if c.kind == "bitflip":
            width, flips = LAYOUTS[dtype][0], c.flips
            assert isinstance(flips, tuple), f"Corruption sets flips to (low, high), not {flips!r}"
            if isinstance(c.bits, int):
                if c.bits >= width:
                    raise ConfigError(
                        f"{self.profile.path}: fault[{i}].bits = {c.bits} is outside the {width} bits of "
                        f"{detail['dtype']}; use a bit index 0..{width - 1} or a field name"
                    )
                bits = [c.bits] * values.numel()
            elif c.bits is None:
                raise AssertionError("Corruption sets bits for a bitflip")
            elif flips != (1, 1):  # a multi-bit flip: distinct bits of the field per element
                choices = field_bits(dtype, c.bits)
                sets = [rng.sample(choices, min(rng.randint(*flips), len(choices))) for _ in range(values.numel())]
                detail["bits"] = sets[:SHOWN]
                return flip_bit_sets(values, sets), detail
            else:
                choices = field_bits(dtype, c.bits)
                bits = [rng.choice(choices) for _ in range(values.numel())]
            detail["bits"] = bits[:SHOWN]
            return flip_bits(values, bits), detail
        if c.kind == "scale":
            assert isinstance(c.factor, tuple), f"Corruption sets factor to (low, high), not {c.factor!r}"
            lo, hi = c.factor
            factor = lo if lo == hi else math.exp(rng.uniform(math.log(lo), math.log(hi)))
            detail["factor"] = factor
            return scale(values, factor), detail
        assert c.value is not None, "Corruption requires value for kind stuck"
        detail["value"] = c.value
        return stuck(values, c.value), detail


def _corruptible(t: Any) -> bool:
    """A tensor of a floating dtype with elements here (a DTensor: in this rank's shard)."""
    return isinstance(t, torch.Tensor) and t.dtype in LAYOUTS and local_shard(t).numel() > 0


def _aliases(t: torch.Tensor, args: tuple) -> bool:
    """True if ``t`` shares memory with an input, so editing it in place would corrupt the input too."""
    ptr = local_shard(t).untyped_storage().data_ptr()
    for a in args:
        for x in a if isinstance(a, (tuple, list)) else (a,):
            if isinstance(x, torch.Tensor) and local_shard(x).untyped_storage().data_ptr() == ptr:
                return True
    return False
