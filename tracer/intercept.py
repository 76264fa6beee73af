"""Keep sdctrace's own tensor work out of operator-level interceptors.

The fault emulator and the ABFT checker see every aten op dispatched on the
training thread. Fingerprints, checkpoints and replay bookkeeping are sdctrace's
own computations, not the workload's, so they run inside `own_ops()` and the
interceptors pass them through untouched.

An interceptor is a Python `TorchDispatchMode`, so each op it sees costs a round
trip through Python. Interceptors derive from `Interceptor`, and `own_ops()` lifts
them off the dispatch-mode stack for its duration: sdctrace's own ops (about 40 % of a
traced step's) then never reach them. ``in_own_ops()`` stays the rule for an
interceptor that cannot be lifted (another mode above it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode, _push_mode

_state = threading.local()

# What an interceptor is given instead of a Tracer, so it works with any training loop:
Clock = Callable[[], tuple[int, ...]]  # the current (step, microbatch[, attempt of a guarded re-run])
Sink = Callable[[str, dict[str, Any]], None]  # log one event: (kind, fields)


class Interceptor(TorchDispatchMode):
    """A dispatch mode for the workload's ops only: `own_ops()` takes it off the stack."""


def _interceptor(mode: TorchDispatchMode) -> bool:
    return isinstance(mode, Interceptor)


def lift(which: Callable[[TorchDispatchMode], bool] = _interceptor) -> list[TorchDispatchMode]:
    """Pop the modes on top of this thread's dispatch-mode stack that ``which`` picks (interceptors);
    `restore` puts them back."""
    modes = []
    while (mode := _get_current_dispatch_mode()) is not None and which(mode):
        modes.append(_pop_mode())
    return modes


def restore(modes: list[TorchDispatchMode]) -> None:
    """Push back what `lift` popped."""
    while modes:
        _push_mode(modes.pop())


@contextmanager
def own_ops() -> Iterator[None]:
    """Mark the ops run inside as sdctrace's own (not to be corrupted or checked)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    lifted = lift()
    try:
        yield
    finally:
        restore(lifted)
        _state.depth = depth


def in_own_ops() -> bool:
    """True while the current thread runs sdctrace's own ops."""
    return getattr(_state, "depth", 0) > 0


def suspend(modes: list[TorchDispatchMode]) -> None:
    """Remember interceptors lifted for the optimizer step now running (`faults.scope`), so that
    `workload_ops` can put them back for workload code run inside the step's hooks."""
    _state.suspended = modes


def take_suspended() -> list[TorchDispatchMode]:
    """The interceptors `suspend` holds, now no longer held (to be restored)."""
    modes = getattr(_state, "suspended", [])
    _state.suspended = []
    return modes


@contextmanager
def workload_ops() -> Iterator[None]:
    """Run the workload's own ops from inside an optimizer step's hooks (the guard's re-run of a step) with
    the interceptors that the step lifted back on the stack: a re-run must meet the emulator and the checker
    as the first run did."""
    modes = take_suspended()
    restore(list(modes))
    try:
        yield
    finally:
        suspend(lift(lambda mode: any(mode is m for m in modes)))

