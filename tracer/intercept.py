"""Keep sdctrace's own tensor work out of operator-level interceptors.

The fault emulator and the ABFT checker see every aten op dispatched on the
training thread. Fingerprints, checkpoints and replay bookkeeping are sdctrace's
own computations, not the workload's, so they run inside `own_ops()` and the
interceptors pass them through untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_state = threading.local()

# What an interceptor is given instead of a Tracer, so it works with any training loop:
Clock = Callable[[], tuple[int, int]]  # the current (step, microbatch)
Sink = Callable[[str, dict[str, Any]], None]  # log one event: (kind, fields)


@contextmanager
def own_ops() -> Iterator[None]:
    """Mark the ops run inside as sdctrace's own (not to be corrupted or checked)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def in_own_ops() -> bool:
    """True while the current thread runs sdctrace's own ops."""
    return getattr(_state, "depth", 0) > 0
