"""Operator-level interception of the workload's ops, paid only on the ops an interceptor names.

The fault emulator and the ABFT checker act on aten ops of the forward and backward
passes. A Python ``TorchDispatchMode`` would see every op of the step and cost each a
round trip through Python (about 1.2-1.3x a small model's step for a mode that does
nothing). An `Interceptor` instead names its ops; while one is active, a dispatch key
sits in this thread's dispatch-key set, and only the ops an active interceptor names
have a kernel there (a Python one that runs the interceptors); every other op falls
through it in C++.

The key is torch's spare mode key, ``TESTING_ONLY_GenericMode``, the one functionality
key torch leaves unused and that a thread can switch on by itself. It is above autograd:
an interceptor sees an op as called, forward ops with their autograd history attached
(so it edits results with `below_autograd`), backward ops as the autograd engine runs
them. CompositeImplicitAutograd ops (``linear``, ``matmul`` on CPU) get no kernel: they
are seen as the ops they decompose into, as a dispatch mode below autograd sees them.

An interceptor that can settle most calls without Python (the fault emulator: a draw that
misses changes nothing) may offer a C++ kernel for the ops it alone names
(`Interceptor.native_kernel`); the router registers that one instead and hands it the
Python kernel for the calls it cannot settle. While a second interceptor names the op,
the op gets the Python kernel that runs both.

Fingerprints, checkpoints and replay bookkeeping are sdctrace's own computations, not
the workload's, so they run inside `own_ops()`, which switches the key off: the
interceptors never see them. A plain optimizer step is switched off the same way
(`pause`/`resume`, from `faults.scope`).

Interceptors are process-wide, like torch's optimizer hooks: the ones entered form one
stack; the key's on/off state is per thread and follows the autograd engine into its
threads. The last one entered sees an op first and calls it through the ones below.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import torch

from tracer.compiled import refuse_compilation
from tracer.errors import ConfigError
from tracer.torch_internals import (
    AutoDispatchBelowAutograd,
    DispatchKeySet,
    OpOverload,
    OpOverloadPacket,
    destroy_library,
    dispatch_key_excluded,
    dispatch_key_included,
    has_kernel_for_dispatch_key,
    op_entry,
    op_name,
    parse_dispatch_key,
    set_dispatch_key_excluded,
    set_dispatch_key_included,
)

_KEY_NAME = "TESTING_ONLY_GenericMode"
_state = threading.local()

# What an interceptor is given instead of a Tracer, so it works with any training loop:
Clock = Callable[[], tuple[int, ...]]  # the current (step, microbatch[, attempt of a guarded re-run])
Sink = Callable[[str, dict[str, Any]], None]  # log one event: (kind, fields)
Call = Callable[..., Any]  # runs the op through the interceptors below: call(*args, **kwargs)
# Registers a C++ kernel for one overload (its qualified name, without "aten::") that hands the calls it cannot
# settle to the given Python kernel; returns what removes it again (``close()``).
NativeKernel = Callable[[str, Callable[..., Any]], Any]


class Interceptor:
    """Sees the workload's calls of the aten ops in ``ops`` while entered (a context manager)."""

    ops: frozenset[OpOverloadPacket] = frozenset()
    title = "operator interceptor"  # what it is, in messages: "fault emulator"

    def intercept(self, func: OpOverload, args: tuple, kwargs: dict, call: Call) -> Any:
        """Run ``call(*args, **kwargs)`` (the op) and return its result, or what replaces it."""
        return call(*args, **kwargs)

    def native_kernel(self, op: OpOverload) -> NativeKernel | None:
        """A C++ kernel for ``op``, used while this interceptor is the only active one naming it: it settles the
        calls it can without Python and hands the others to the Python kernel, which calls `intercept`. None:
        every call comes to `intercept`."""
        return None

    def __enter__(self) -> Self:
        _router().push(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _router().pop(self)


class _Router:
    """The key's kernels: one for each op overload that an active interceptor names, removed when none does."""

    def __init__(self) -> None:
        try:
            self.key = parse_dispatch_key(_KEY_NAME)
        except RuntimeError as e:
            raise ConfigError(
                f"torch {torch.__version__} has no {_KEY_NAME} dispatch key, which sdctrace's fault emulator and "
                "ABFT checker use; use torch 2.x as pinned in pyproject.toml"
            ) from e
        self.keys = DispatchKeySet(self.key)
        self._fallthrough = torch.library.Library("_", "IMPL")
        self._fallthrough.fallback(torch.library.fallthrough_kernel, _KEY_NAME)
        self._lock = threading.Lock()
        self._overloads: dict[OpOverloadPacket, list[tuple[str, OpOverload]]] = {}
        # overload -> (the interceptor whose C++ kernel it has, None for the Python one; what removes it)
        self._kernels: dict[str, tuple[Interceptor | None, Callable[[], None]]] = {}
        self.stack: list[Interceptor] = []
        self._calls: dict[OpOverload, Call] = {}  # each op through the interceptors that name it

    def push(self, interceptor: Interceptor) -> None:
        refuse_compilation(active)  # what torch.compile runs never reaches the key
        with self._lock:
            self.stack.append(interceptor)
            self._calls = {}
            self._register()
        depth = getattr(_state, "entered", 0)
        if depth == 0:
            _state.included = dispatch_key_included(self.key)
            set_dispatch_key_included(self.key, True)
        _state.entered = depth + 1

    def pop(self, interceptor: Interceptor) -> None:
        with self._lock:
            self.stack = [i for i in self.stack if i is not interceptor]
            self._calls = {}
            self._register()
        _state.entered = getattr(_state, "entered", 1) - 1
        if _state.entered == 0:
            set_dispatch_key_included(self.key, _state.included)

    def _register(self) -> None:
        """One kernel for each overload an active interceptor names: that interceptor's C++ kernel where it is
        the only one and offers one, else the Python kernel that runs the chain. An overload no active
        interceptor names loses its kernel and costs nothing again."""
        chains: dict[str, tuple[OpOverload, list[Interceptor]]] = {}
        for interceptor in self.stack:
            for packet in interceptor.ops:
                for qualified, op in self._dispatched(packet):
                    chains.setdefault(qualified, (op, []))[1].append(interceptor)
        for qualified in [q for q in self._kernels if q not in chains]:
            self._kernels.pop(qualified)[1]()
        for qualified, (op, chain) in chains.items():
            native = chain[0].native_kernel(op) if len(chain) == 1 else None
            owner = chain[0] if native is not None else None
            held = self._kernels.get(qualified)
            if held is not None and held[0] is owner:
                continue
            if held is not None:
                held[1]()
            name = qualified.removeprefix("aten::")
            if native is not None:
                remove = native(name, self._kernel(op)).close
            else:
                library = torch.library.Library("aten", "IMPL")
                library.impl(name, self._kernel(op), _KEY_NAME)
                remove = functools.partial(destroy_library, library)
            self._kernels[qualified] = (owner, remove)

    def _dispatched(self, packet: OpOverloadPacket) -> list[tuple[str, OpOverload]]:
        """The packet's overloads that reach the key, by qualified name."""
        known = self._overloads.get(packet)
        if known is None:
            known = self._overloads[packet] = []
            for name in packet.overloads():
                op = getattr(packet, name)
                qualified = op_name(op) + ("" if name == "default" else f".{name}")
                try:
                    decomposed = _decomposed(qualified)
                except RuntimeError:
                    continue  # a TorchScript-only overload (aten::div.int): never dispatched
                if not decomposed:  # else seen as the ops it decomposes into
                    known.append((qualified, op))
        return known

    def _kernel(self, op: OpOverload) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            call = self._calls.get(op)
            if call is None:
                chain = tuple(i for i in reversed(self.stack) if op.overloadpacket in i.ops)
                call = self._calls[op] = _through(chain, op, self.key)
            return call(*args, **kwargs)

        return kernel


def _decomposed(qualified: str) -> bool:
    """The op reaches the devices interceptors run on (CPU, CUDA) only as the ops its CompositeImplicitAutograd
    kernel calls."""
    has = has_kernel_for_dispatch_key
    return has(qualified, "CompositeImplicitAutograd") and not any(
        has(qualified, key) for key in ("CPU", "CUDA", "CompositeExplicitAutograd")
    )


def _through(chain: tuple[Interceptor, ...], op: OpOverload, key: Any) -> Call:
    """``op`` called through ``chain`` (outermost first), the key off below the last."""
    run = op_entry(op)  # the op's C++ entry, without OpOverload.__call__'s Python frame
    exclude = set_dispatch_key_excluded

    def bare(*args: Any, **kwargs: Any) -> Any:
        # The key was not excluded, or this kernel would not run. Two calls, not ExcludeDispatchKeyGuard's
        # context manager: 0.7 us less on every call of a named op.
        exclude(key, True)
        try:
            return run(*args, **kwargs)
        finally:
            exclude(key, False)

    call = bare
    for interceptor in reversed(chain):
        call = _wrap(interceptor.intercept, op, call)
    return call


def _wrap(intercept: Callable[[OpOverload, tuple, dict, Call], Any], op: OpOverload, inner: Call) -> Call:
    def call(*args: Any, **kwargs: Any) -> Any:
        return intercept(op, args, kwargs, inner)

    return call


_the_router: _Router | None = None
_router_lock = threading.Lock()


def _router() -> _Router:
    global _the_router
    with _router_lock:
        if _the_router is None:
            _the_router = _Router()
        return _the_router


def active() -> tuple[Interceptor, ...]:
    """The interceptors that see this thread's ops now, in the order entered (none inside `own_ops`)."""
    r = _the_router
    if r is None or not dispatch_key_included(r.key):
        return ()
    if dispatch_key_excluded(r.key):
        return ()
    return tuple(r.stack)


class own_ops:  # noqa: N801 - used as a function: ``with own_ops():``
    """Mark the ops run inside as sdctrace's own (not to be corrupted or checked).

    A class, not a generator-based context manager: every fingerprint enters it, and this costs a third."""

    __slots__ = ("_depth", "_key", "_was")

    def __enter__(self) -> None:
        self._depth = depth = getattr(_state, "depth", 0)
        _state.depth = depth + 1
        router = _the_router
        self._key = key = router.key if router is not None else None
        if key is not None:
            self._was = dispatch_key_excluded(key)
            set_dispatch_key_excluded(key, True)

    def __exit__(self, *exc: object) -> None:
        if self._key is not None:
            set_dispatch_key_excluded(self._key, self._was)
        _state.depth = self._depth


def in_own_ops() -> bool:
    """True while the current thread runs sdctrace's own ops."""
    return getattr(_state, "depth", 0) > 0


@contextmanager
def below_autograd() -> Iterator[None]:
    """Edit a tensor in place unseen by autograd: no history and no version bump, so a result an op saved for
    backward carries the edit as if the op had produced it (an interceptor runs above autograd)."""
    with torch.no_grad(), AutoDispatchBelowAutograd():
        yield


def pause() -> None:
    """Switch the interceptors off on this thread for a plain optimizer step, until `resume`."""
    r = _the_router
    if r is not None and not dispatch_key_excluded(r.key):
        set_dispatch_key_excluded(r.key, True)
        _state.paused = True


def resume() -> None:
    """Undo a `pause`, if one is in effect on this thread."""
    r = _the_router
    if paused() and r is not None:  # paused only ever with a router
        set_dispatch_key_excluded(r.key, False)
        _state.paused = False


def paused() -> bool:
    """The interceptors are paused on this thread for an optimizer step now running."""
    return getattr(_state, "paused", False)


@contextmanager
def workload_ops() -> Iterator[None]:
    """Run the workload's own ops from inside an optimizer step's hooks (the guard's re-run of a step) with the
    interceptors the step paused switched back on: a re-run must meet the emulator and the checker as the first
    run did."""
    was = paused()
    resume()
    try:
        yield
    finally:
        if was:
            pause()
