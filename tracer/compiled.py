"""torch.compile and the interceptors: refused in one line, never silently ignored.

An `tracer.intercept.Interceptor` sees the aten ops that eager execution dispatches. Code that
``torch.compile`` compiled does not dispatch them where an interceptor can act: inductor fuses them into
kernels of its own, and AOTAutograd runs a compiled forward with autograd off and no module hooks, so the
scope (`faults.scope`) finds no phase and no site. A fault emulator or ABFT checker around compiled code
would do nothing and say nothing, and a faulty node would look healthy. So while an interceptor is active on
a thread, a compilation that starts on that thread raises `ConfigError`, naming what cannot work and how to
record without compiling.

The hook is Dynamo's start-of-compilation callback. A model compiled before the interceptor entered is
compiled again when it next runs: the scope's module hooks fail the compiled code's guards. Importing
``torch._dynamo`` takes seconds, so it is not imported for this: when it is not loaded as the first
interceptor enters, nothing has been compiled yet, and a finder registers the callback the moment something
imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tracer.errors import ConfigError
from tracer.torch_internals import DYNAMO, compiled_in_place, compiled_module_type, on_compile_start

_lock = threading.Lock()
_watched = False  # the callback is registered, or the finder waits for Dynamo to load


def refuse_compilation(active: Callable[[], Sequence[Any]]) -> None:
    """From now on, a compilation that starts on a thread where ``active()`` names interceptors raises
    ConfigError. Call it when an interceptor enters; later calls cost a flag check."""
    global _watched
    if _watched:
        return
    with _lock:
        if _watched:
            return  # type: ignore[unreachable]  # another thread set it while this one waited for the lock
        _watched = True
        if DYNAMO in sys.modules:
            _register(active)
        else:
            sys.meta_path.insert(0, _WhenDynamoLoads(active))


def disabled_twin(fn: Callable[..., Any], reason: str) -> Callable[..., Any] | None:
    """``fn`` as torch.compile calls it as it is instead of tracing into it (a hook that hands tensors to
    sdctrace's own kernels, which Dynamo cannot trace: without this it warns about them and breaks the graph
    there anyway); None where Dynamo is not loaded, as then nothing has been compiled yet.

    A hook calls its twin only while Dynamo traces it, and runs itself otherwise::

        def hook(*args):
            if twin is not None and is_dynamo_compiling():  # False in eager code; Dynamo folds it to True
                return twin(*args)
            ...
        twin = disabled_twin(hook, "why")

    so that eager code pays one call of a function that returns False, not the wrapper's 1.5 us: Dynamo is loaded
    in every process that has taken an optimizer step. A model compiled after the hooks went in, in a process
    that had not loaded Dynamo by then, keeps Dynamo's warning about the kernel."""
    if DYNAMO not in sys.modules:
        return None
    import torch

    return torch.compiler.disable(fn, reason=reason)


def refuse_compiled(model: Any, title: str) -> None:
    """Raise the `refusal` for an interceptor titled ``title`` at once when ``model`` is visibly compiled: it or a
    submodule is ``torch.compile``'s wrapper or was compiled in place (``model.compile()``). Otherwise the
    refusal would come only from inside the first compilation, wrapped in Dynamo's own long error."""
    wrapper = compiled_module_type()
    for path, m in model.named_modules():
        if (wrapper is not None and isinstance(m, wrapper)) or compiled_in_place(m):
            what = f"the model's submodule {path}" if path else "the model given to it"
            raise refusal([title], f"{what} is compiled")


def refusal(titles: Sequence[str], found: str = "") -> ConfigError:
    """The error for a compilation under the interceptors with these titles; ``found``: what was compiled."""
    names = " and the ".join(dict.fromkeys(titles)) or "operator interceptor"
    return ConfigError(
        f"sdctrace's {names} cannot act inside torch.compile'd code{f' ({found})' if found else ''}: "
        "compiled kernels do not call the aten ops it "
        "acts on, so it would silently do nothing; record this node and its golden twin without torch.compile "
        "(no torch.compile(model) or model.compile(); TrainingArguments(torch_compile=False); Lightning: no "
        "compile in configure_model), or without the fault profile and ABFT"
    )


def _register(active: Callable[[], Sequence[Any]]) -> None:
    def refuse(_: Any) -> None:
        interceptors = active()
        if interceptors:
            raise refusal([getattr(i, "title", "operator interceptor") for i in interceptors])

    on_compile_start(refuse)


class _WhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Registers the callback once ``torch._dynamo`` has loaded (by whoever imports it), then steps aside."""

    def __init__(self, active: Callable[[], Sequence[Any]]) -> None:
        self.active = active

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        load, active = spec.loader.exec_module, self.active

        def exec_module(module: Any) -> None:
            load(module)
            _register(active)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this one spec's loader, wrapped
        return spec
