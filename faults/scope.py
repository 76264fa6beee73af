"""Which module and phase the aten op being dispatched right now belongs to.

Operator-level interceptors (the fault emulator, the ABFT checker) see bare aten
ops; to name a site they need the enclosing module paths and whether the op runs
in forward or backward.

Forward: pre/post hooks keep a stack of the hooked modules whose forward is
running. Backward: when a module's forward returns, the autograd nodes it created
(those reachable from its outputs with a sequence number taken during its forward)
get the module's path in their ``metadata``; the autograd engine runs one node at
a time, so the current node's metadata names the modules an op of the backward
belongs to. Full backward hooks would be simpler but insert identity nodes that
change how gradients are summed, i.e. the bits of training; metadata does not. The
walk runs in faults' native kernel (faults/native.cpp) where it is built.

Optimizer steps: global optimizer-step hooks mark each scope while a ``torch.optim`` step
runs (`ModuleScope.optimizing`), and an op outside the forward and the backward in it is
in the optimizer phase, which a fault rule may name (the update: ``addcdiv_``, ``lerp_``,
``_foreach_addcdiv_``, ...). Every other op without a phase (gradient clipping,
bookkeeping) is never corrupted or checked. Every call of an op an interceptor names
costs a round trip through Python (or the emulator's gate), so a plain step runs with the
interceptors paused unless one of them needs its ops now
(`ScopedInterceptor.needs_optimizer_step`: the emulator, while a rule for the optimizer
phase is armed).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Self

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from tracer import kernel
from tracer.intercept import Interceptor, pause, resume
from tracer.log.records import Phase
from tracer.torch_internals import autograd_sequence_nr, current_autograd_node, in_backward, tree_leaves

_KEY = "sdctrace.scope"

NATIVE_ENV = "SDCTRACE_FAULTS_NATIVE"  # "torch": Python only, even where faults' native kernel is built
_native_state: list[ModuleType | None] = []  # [] until the first scope looks
_native_lock = threading.Lock()


def native() -> ModuleType | None:
    """faults' native kernel (faults/native.cpp: the emulator's gate, the scope's node labels), loaded by the
    first scope; None (said once) when it is not built."""
    if _native_state:
        return _native_state[0]
    from faults.native_kernel import NATIVE  # not at import: ``python -m faults.native_kernel`` runs it

    return kernel.load_once(
        NATIVE,
        _native_state,
        _native_lock,
        NATIVE_ENV,
        "sdctrace's native kernel for the fault emulator and the ABFT checker is not built for this torch and "
        "Python, so the emulator sees every call of an op a rule names in Python (the same faults, about 4 us more "
        "a call) and sites are labelled in Python (about 3 % of a small model's step). Build it once with "
        "`python -m faults.native_kernel` (needs a C++ compiler and ninja; `make venv` does it).",
    )


def current_phase(forward_active: bool) -> Phase | None:
    """BACKWARD inside the autograd engine, FORWARD inside a hooked module or with
    grad enabled, None otherwise (optimizer step, gradient clipping, bookkeeping)."""
    # torch.utils.checkpoint relies on this too: -1 unless the engine runs a graph task.
    if in_backward():
        return Phase.BACKWARD
    if forward_active or torch.is_grad_enabled():
        return Phase.FORWARD
    return None


class ModuleScope:
    """Hooks ``modules`` (path, module) while active; reports the paths around the current op."""

    def __init__(self, modules: Sequence[tuple[str, nn.Module]]) -> None:
        self.modules = list(modules)
        built = native()
        self._label = functools.partial(_label_natively, built) if built is not None else _label
        self._forward: list[str] = []
        self._optimizer: list[str] = []  # the class name of the optimizer whose step runs now, if one does
        self._starts: list[int] = []
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> ModuleScope:
        for path, module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._enter_forward(path)))
            self._handles.append(module.register_forward_hook(self._exit_forward(path), always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._forward.clear()
        self._optimizer.clear()
        self._starts.clear()

    @property
    def forward_active(self) -> bool:
        """A hooked module's forward is running."""
        return bool(self._forward)

    @property
    def forward_paths(self) -> list[str]:
        """The paths of the hooked modules whose forward is running, outermost first: the live list, which the
        fault emulator's C++ gate reads on every call."""
        return self._forward

    @property
    def optimizing(self) -> bool:
        """An optimizer's step() runs now: an op without a `phase` is one of its update's."""
        return bool(self._optimizer)

    @property
    def optimizer_steps(self) -> list[str]:
        """The class name of the optimizer whose step runs now, or empty: the live list, which the fault
        emulator's C++ gate reads on a call without a phase."""
        return self._optimizer

    def phase(self) -> Phase | None:
        return current_phase(bool(self._forward))

    def stack(self, phase: Phase) -> tuple[str, ...]:
        """Paths of the hooked modules the current op belongs to, outermost first."""
        if phase == Phase.FORWARD:
            return tuple(self._forward)
        node = current_autograd_node()
        return node.metadata.get(_KEY, ()) if node is not None else ()

    def _enter_forward(self, path: str) -> Callable[[nn.Module, Any], None]:
        def hook(module: nn.Module, args: Any) -> None:
            resume()  # a step that raised left the interceptors paused
            self._forward.append(path)
            self._starts.append(autograd_sequence_nr())

        return hook

    def _exit_forward(self, path: str) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._forward.pop()
            start = self._starts.pop()
            if torch.is_grad_enabled():
                self._label(output, path, start, autograd_sequence_nr())

        return hook


def _label_natively(built: ModuleType, output: Any, path: str, start: int, end: int) -> None:
    """`_label` in faults' native kernel: the same labels."""
    built.label([t for t in tree_leaves(output) if isinstance(t, torch.Tensor)], path, start, end, _KEY)


def _label(output: Any, path: str, start: int, end: int) -> None:
    """Prepend ``path`` to the scope of every node this module's forward created (sequence
    numbers in [start, end)); inner modules returned first, so paths end up outermost first."""
    # Any: torch's stub of autograd's Node declares metadata a method, where a node's is a dict attribute
    todo: list[Any] = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: dict[int, Any] = {}  # holds the nodes, so their ids stay unique during the walk
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or not start <= node._sequence_nr() < end:
            continue
        seen[id(node)] = node
        node.metadata[_KEY] = (path, *node.metadata.get(_KEY, ()))
        todo.extend(n for n, _ in node.next_functions)


class ScopedInterceptor(Interceptor):
    """An interceptor whose ``scope`` hooks are installed exactly while it is active.

    An op of a plain ``torch.optim`` step has no forward or backward phase: `_OptimizerSteps` runs such
    steps with the interceptors paused, unless one of them `needs_optimizer_step`.
    """

    scope: ModuleScope

    def needs_optimizer_step(self) -> bool:
        """Whether the optimizer step about to run must reach this interceptor (called before each step)."""
        return False

    def __enter__(self) -> Self:
        self.scope.__enter__()
        _OptimizerSteps.hold(self)
        try:
            return super().__enter__()
        except BaseException:
            _OptimizerSteps.release(self)
            self.scope.__exit__()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            resume()  # an optimizer step that raised left them paused
            super().__exit__(*exc)
        finally:
            _OptimizerSteps.release(self)
            self.scope.__exit__()


class _OptimizerSteps:
    """Global optimizer-step hooks, held while any scoped interceptor is active: they mark the scopes while a
    step runs, and a step in which none of the interceptors could touch an op runs with them paused on its
    thread."""

    _lock = threading.Lock()
    _handles: list[RemovableHandle] = []
    _held: list[ScopedInterceptor] = []  # the active scoped interceptors

    @classmethod
    def hold(cls, interceptor: ScopedInterceptor) -> None:
        with cls._lock:
            if not cls._held:
                cls._handles = [
                    register_optimizer_step_pre_hook(cls._before),
                    register_optimizer_step_post_hook(cls._after),
                ]
            cls._held = [*cls._held, interceptor]

    @classmethod
    def release(cls, interceptor: ScopedInterceptor) -> None:
        with cls._lock:
            held = list(cls._held)
            held.remove(interceptor)  # one entry: an interceptor entered twice holds two
            cls._held = held
            if not cls._held:
                for h in cls._handles:
                    h.remove()

    @classmethod
    def _before(cls, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        resume()
        held = cls._held
        name = type(optimizer).__name__
        for interceptor in held:
            interceptor.scope.optimizer_steps[:] = (name,)  # assigned, not appended: a step that raised left one
        # Phase None for every op but the optimizer's: a torch.optim step turns grad off unless differentiable,
        # only a closure (LBFGS) runs a forward inside it, and it is outside the backward unless a gradient
        # hook calls it.
        builtin = type(optimizer).__module__.startswith("torch.optim.")
        closure = len(args) > 1 or kwargs.get("closure") is not None
        if not builtin or closure or optimizer.defaults.get("differentiable") or in_backward():
            return
        if any(i.scope.forward_active for i in held) or any(i.needs_optimizer_step() for i in held):
            return
        pause()

    @classmethod
    def _after(cls, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        resume()
        for interceptor in cls._held:
            interceptor.scope.optimizer_steps.clear()
