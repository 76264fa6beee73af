"""`StateFaults`: a profile's ``[[state]]`` rules, bits of parameters flipped between steps.

    with StateFaults(profile, model, clock=clock, sink=sink, seed=3):
        train()          # after the update of each rule's step, its bit of its parameter flips

The fault emulator (`faults.emulator`) enters one for a profile that has state rules; a
rule is one bit of one element of one named parameter, flipped right after the
optimizer update of its step: what a flip in the memory that holds the weights
between two steps does. Op rules cannot express it: every op that writes a parameter
is in the update, and a flip there is rounded through the rest of the update.

Why after the update and not before the step's forward: the flipped value is then
exactly the value the next step reads, the parameter differs from a clean twin's by
exactly that bit after the step, and the first record of a traced run that differs is
that parameter's PARAM record at that step (the Tracer fingerprints parameters in
its own step post-hook, which this one is put in front of). A flip before the
forward would be rounded through the update too.

The element (when the rule names none) and the bit (when the rule names a field)
come from a generator seeded by the profile seed, the run's fault seed and the rule's
index: the same in every run of the profile with that fault seed. Each flip is logged as a ``fault``
event: ``phase`` "optimizer", ``op`` "state", ``index`` the element, ``detail`` the
``parameter`` and the ``bits``. A replay syncs each step's parameters from golden, so
it cannot see a state fault; a diff of the runs' fingerprints finds it.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from faults.corrupt import LAYOUTS, field_bits, flip_bits
from faults.profile import FaultProfile, StateRule
from tracer.errors import ConfigError
from tracer.intercept import Clock, Sink, below_autograd, own_ops
from tracer.sharding import local_shard
from tracer.sites import named_parameters


class StateFaults:
    """Flip the bits ``profile``'s state rules name while active, logging each flip to ``sink``."""

    def __init__(
        self,
        profile: FaultProfile,
        model: nn.Module,
        *,
        clock: Clock,
        sink: Sink,
        seed: int = 0,
        rank: int = 0,
        role: str = "train",
    ) -> None:
        self._clock, self._sink = clock, sink
        params = dict(named_parameters(model))
        self._rules: list[tuple[StateRule, nn.Parameter, int, int]] = []  # rule, parameter, element, bit
        for i, rule in enumerate(profile.states):
            where = f"{profile.path}: state[{i}]"
            if rule.parameter not in params:
                raise ConfigError(
                    f"{where}.parameter = {rule.parameter!r} is no parameter of the model "
                    f"(names look like {', '.join(list(params)[:6])})"
                )
            if (rule.ranks is not None and rank not in rule.ranks) or (
                rule.roles is not None and role not in rule.roles
            ):
                continue
            tensor = local_shard(params[rule.parameter].detach())
            if tensor.dtype not in LAYOUTS or tensor.numel() == 0:
                raise ConfigError(
                    f"{where}: parameter {rule.parameter} holds no floating-point element here "
                    f"({tensor.dtype}, {tensor.numel()} elements)"
                )
            rng = random.Random(f"sdctrace-state:{profile.seed}:{seed}:{i}")
            element = rng.randrange(tensor.numel()) if rule.element is None else rule.element
            if element >= tensor.numel():
                raise ConfigError(
                    f"{where}.element = {element} is outside {rule.parameter}'s {tensor.numel()} "
                    "elements (a DTensor's: this rank's shard)"
                )
            width = LAYOUTS[tensor.dtype][0]
            if isinstance(rule.bits, int) and rule.bits >= width:
                raise ConfigError(f"{where}.bits = {rule.bits} is outside the {width} bits of {tensor.dtype}")
            bit = rule.bits if isinstance(rule.bits, int) else rng.choice(field_bits(tensor.dtype, rule.bits))
            self._rules.append((rule, params[rule.parameter], element, bit))
        self._handles: list[RemovableHandle] = []
        self._hooked: set[int] = set()  # ids of the optimizers whose steps carry the post-hook
        self._fired: set[tuple[int, int]] = set()  # (rule, step): once, though a step may run several updates

    def __enter__(self) -> StateFaults:
        if self._rules:
            self._handles.append(register_optimizer_step_pre_hook(self._before_update))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._hooked.clear()
        self._fired.clear()

    def _before_update(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """On an optimizer's first step that holds a rule's parameter: put the flips first among its post-hooks."""
        if id(optimizer) in self._hooked:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not any(id(p) in held for _, p, _, _ in self._rules):
            return
        self._hooked.add(id(optimizer))
        handle = optimizer.register_step_post_hook(self._after_update)
        hooks = handle.hooks_dict_ref()
        if hooks is not None:  # before the Tracer's, which fingerprints the parameters
            hooks.move_to_end(handle.id, last=False)
        self._handles.append(handle)

    def _after_update(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        step = self._clock()[0]
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for i, (rule, param, element, bit) in enumerate(self._rules):
            if rule.step == step and id(param) in held and (i, step) not in self._fired:
                self._fired.add((i, step))
                self._flip(rule, param, element, bit)

    def _flip(self, rule: StateRule, param: nn.Parameter, element: int, bit: int) -> None:
        coords: tuple[torch.Tensor, ...]
        with own_ops(), below_autograd(), torch.no_grad():
            tensor = local_shard(param.data)
            if tensor.is_contiguous():
                view, coords = tensor.view(-1), (torch.tensor([element], device=tensor.device),)
            else:
                view = tensor
                coords = torch.unravel_index(torch.tensor([element], device=tensor.device), tensor.shape)
            original = view[coords]
            corrupted = flip_bits(original, [bit])
            view.index_put_(coords, corrupted)
        self._sink(
            "fault",
            {
                "microbatch": 0,  # the update belongs to the whole step, as its PARAM records do
                "site": "",
                "op": "state",
                "phase": "optimizer",
                "kind": "bitflip",
                "elements": 1,
                "index": [element],
                "original": original.tolist(),
                "corrupted": corrupted.tolist(),
                "detail": {
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "bits": [bit],
                    "parameter": rule.parameter,
                },
            },
        )
