"""Every private torch API sdctrace relies on, behind one small public name each.

A torch upgrade may rename or remove any of these; this module is where that shows. Callers use the names
here, never ``torch._C`` or ``torch._ops`` themselves. A name whose API this torch lacks stays importable and
raises `ConfigError` when called, naming the API and the feature that needs it; `missing_apis` lists them
all at once (tests/tracer/test_torch_internals.py fails on any)::

    from tracer.torch_internals import in_backward, missing_apis
    if in_backward(): ...
    for api in missing_apis(): print(api.message())

The dispatch-key functions are the very C++ entries (no Python frame added): `tracer.intercept` calls them
on every intercepted op and every fingerprint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import torch

from tracer.errors import ConfigError

DYNAMO = "torch._dynamo"  # Dynamo's module, which takes seconds to import: looked up in sys.modules only


@dataclass(frozen=True)
class PrivateApi:
    """One private API of ``package`` (torch here; transformers and Lightning in workload/'s `hf_internals` and
    `lightning_internals`): its dotted name, the sdctrace feature that needs it, and whether the installed
    package has it in the expected shape."""

    name: str
    feature: str
    present: Callable[[], bool]
    package: str = "torch"

    def message(self) -> str:
        try:
            version = metadata.version(self.package)
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        return (
            f"{self.package} {version} removed or changed {self.name}, which sdctrace's {self.feature} needs; "
            "use the version pinned in pyproject.toml"
        )

    def stand_in(self) -> Callable[..., Any]:
        """What sdctrace calls in place of the API where this torch lacks it: it raises, saying so."""

        def missing(*args: Any, **kwargs: Any) -> Any:
            raise ConfigError(self.message())

        return missing


_APIS: list[PrivateApi] = []


def _lookup(name: str) -> Any:
    """The object at dotted ``name`` (``torch._C._foo``), or None."""
    obj: Any = sys.modules["torch"]
    for part in name.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _private(name: str, feature: str) -> Any:
    """The callable at ``name``, or a stand-in that raises `ConfigError` naming it when called."""
    api = PrivateApi(name, feature, lambda: callable(_lookup(name)))
    _APIS.append(api)
    found = _lookup(name)
    return found if callable(found) else api.stand_in()


_INTERCEPT = "operator interception (fault emulator, ABFT checker)"
_SCOPE = "fault scope (which module and phase an op belongs to)"

# -- dispatch keys (tracer.intercept) ------------------------------------------------------------------------
parse_dispatch_key = _private("torch._C._parse_dispatch_key", _INTERCEPT)
DispatchKeySet = _private("torch._C.DispatchKeySet", _INTERCEPT)
dispatch_key_included: Callable[[Any], bool] = _private("torch._C._dispatch_tls_is_dispatch_key_included", _INTERCEPT)
set_dispatch_key_included: Callable[[Any, bool], None] = _private(
    "torch._C._dispatch_tls_set_dispatch_key_included", _INTERCEPT
)
dispatch_key_excluded: Callable[[Any], bool] = _private("torch._C._dispatch_tls_is_dispatch_key_excluded", _INTERCEPT)
set_dispatch_key_excluded: Callable[[Any, bool], None] = _private(
    "torch._C._dispatch_tls_set_dispatch_key_excluded", _INTERCEPT
)
has_kernel_for_dispatch_key: Callable[[str, str], bool] = _private(
    "torch._C._dispatch_has_kernel_for_dispatch_key", _INTERCEPT
)
# Edits below autograd: no history, no version bump (tracer.intercept.below_autograd).
AutoDispatchBelowAutograd = _private("torch._C._AutoDispatchBelowADInplaceOrView", _INTERCEPT)

# -- op objects (tracer.intercept, faults.ops) ---------------------------------------------------------------
if TYPE_CHECKING:  # the checker reads torch's own classes; at run time they may be missing (None, listed below)
    from torch._ops import OpOverload, OpOverloadPacket
else:
    OpOverload = _lookup("torch._ops.OpOverload")
    OpOverloadPacket = _lookup("torch._ops.OpOverloadPacket")
_APIS.append(
    PrivateApi("torch._ops.OpOverload", _INTERCEPT, lambda: isinstance(_lookup("torch._ops.OpOverload"), type))
)
_APIS.append(
    PrivateApi(
        "torch._ops.OpOverloadPacket", _INTERCEPT, lambda: isinstance(_lookup("torch._ops.OpOverloadPacket"), type)
    )
)
_APIS.append(
    PrivateApi(
        "OpOverload._op, ._schema.name and ._schema.is_mutable",
        _INTERCEPT,
        lambda: (
            callable(torch.ops.aten.mm.default._op)
            and torch.ops.aten.mm.default._schema.name == "aten::mm"
            and torch.ops.aten.add_.Tensor._schema.is_mutable is True
        ),
    )
)
_APIS.append(
    PrivateApi(
        "torch.library.Library._destroy", _INTERCEPT, lambda: callable(getattr(torch.library.Library, "_destroy", None))
    )
)
# A mixture-of-experts layer's experts in one call (faults.ops' matmul family, faults.abft's grouped check).
GROUPED_MM: OpOverloadPacket | None = getattr(torch.ops.aten, "_grouped_mm", None)


def op_entry(op: Any) -> Callable[..., Any]:
    """An `OpOverload`'s C++ entry, called without ``OpOverload.__call__``'s Python frame."""
    return op._op


def op_name(op: Any) -> str:
    """An `OpOverload`'s qualified schema name: ``aten::mm``."""
    return op._schema.name


def op_is_mutable(op: Any) -> bool:
    """The op writes into one of its arguments (an in-place or ``out=`` overload)."""
    return op._schema.is_mutable


def destroy_library(library: torch.library.Library) -> None:
    """Remove the kernels ``library`` registered (torch.library has no public way)."""
    library._destroy()


# -- autograd (tracer.tracing, faults.scope) ------------------------------------------------------------------
_graph_task_id = _private("torch._C._current_graph_task_id", "Tracer and fault scope (is the backward running?)")
current_autograd_node = _private("torch._C._current_autograd_node", _SCOPE)
autograd_sequence_nr: Callable[[], int] = _private("torch._C._autograd._get_sequence_nr", _SCOPE)
tree_leaves: Callable[[Any], list[Any]] = _private("torch.utils._pytree.tree_leaves", _SCOPE)
_APIS.append(
    PrivateApi(
        "Tensor._version",
        "site hooks (was a tapped tensor changed in place?)",
        lambda: isinstance(torch.zeros(1)._version, int),
    )
)


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass (torch.utils.checkpoint asks the same way)."""
    return _graph_task_id() != -1


def version_counter(tensor: torch.Tensor) -> int:
    """How many in-place changes ``tensor``'s storage has seen (autograd's version counter)."""
    return tensor._version


# -- torch.compile (tracer.compiled, tracer.sites) ------------------------------------------------------------
def on_compile_start(callback: Callable[[Any], None]) -> None:
    """Have Dynamo call ``callback`` as each compilation starts (imports Dynamo: call it once it is loaded)."""
    from torch._dynamo.callback import on_compile_start as register

    register(callback)


def compiled_module_type() -> type | None:
    """The class of a ``torch.compile``'d module (Dynamo's ``OptimizedModule``), or None while Dynamo is not
    loaded (no instance can exist before)."""
    eval_frame = sys.modules.get(DYNAMO + ".eval_frame")
    return eval_frame.OptimizedModule if eval_frame is not None else None


_APIS.append(
    PrivateApi(
        "torch._dynamo.callback.on_compile_start",
        "refusal of torch.compile under interceptors",
        lambda: callable(_lookup_dynamo("callback", "on_compile_start")),
    )
)


def compiled_in_place(module: torch.nn.Module) -> bool:
    """Whether ``module.compile()`` compiled this module in place (it set nn.Module's ``_compiled_call_impl``)."""
    return getattr(module, "_compiled_call_impl", None) is not None


_APIS.append(
    PrivateApi(
        "torch.nn.Module._compiled_call_impl",
        "refusal of a compiled model under the fault emulator and ABFT",
        lambda: hasattr(torch.nn.Module, "_compiled_call_impl"),
    )
)
_APIS.append(
    PrivateApi(
        "torch._dynamo.eval_frame.OptimizedModule",
        "site names of compiled models",
        lambda: isinstance(_lookup_dynamo("eval_frame", "OptimizedModule"), type),
    )
)


def _lookup_dynamo(module: str, name: str) -> Any:
    """Dynamo's ``module.name``, importing it (slow: for checks, not for recording)."""
    import importlib

    try:
        return getattr(importlib.import_module(f"{DYNAMO}.{module}"), name, None)
    except ImportError:
        return None


# -- DTensor shards (tracer.sharding) -------------------------------------------------------------------------
DTENSOR_UTILS = "torch.distributed.tensor._utils"


def local_shape_and_global_offset(
    global_shape: tuple[int, ...], mesh: Any, placements: Any
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The local shape and global offsets of this rank's shard of a DTensor of ``global_shape`` laid out by
    ``placements`` over ``mesh`` (call it only on a DTensor: its module is loaded by then)."""
    compute = getattr(sys.modules.get(DTENSOR_UTILS), "compute_local_shape_and_global_offset", None)
    if not callable(compute):
        raise ConfigError(_SHARD_API.message())
    shape, offset = compute(global_shape, mesh, placements)
    return tuple(shape), tuple(offset)


def _lookup_dtensor_utils() -> Any:
    """``compute_local_shape_and_global_offset``, importing DTensor (slow: for checks, not for recording)."""
    import importlib

    try:
        return getattr(importlib.import_module(DTENSOR_UTILS), "compute_local_shape_and_global_offset", None)
    except ImportError:
        return None


_SHARD_API = PrivateApi(
    DTENSOR_UTILS + ".compute_local_shape_and_global_offset",
    "shard offsets in run headers",
    lambda: callable(_lookup_dtensor_utils()),
)
_APIS.append(_SHARD_API)


# -- functional collectives (tracer.sharding) ----------------------------------------------------------------
FUNCTIONAL_COLLECTIVES = "torch.distributed._functional_collectives"


def waited(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or the plain tensor an ``AsyncCollectiveTensor`` (the output of a DTensor collective, such as
    ``RowwiseParallel``'s all-reduce) holds, once its collective is done: fingerprints read plain tensors only."""
    cls = getattr(sys.modules.get(FUNCTIONAL_COLLECTIVES), "AsyncCollectiveTensor", None)
    return t.wait() if cls is not None and isinstance(t, cls) else t


def _async_collective_tensor() -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(FUNCTIONAL_COLLECTIVES), "AsyncCollectiveTensor", None)
    except ImportError:
        return None


_APIS.append(
    PrivateApi(
        FUNCTIONAL_COLLECTIVES + ".AsyncCollectiveTensor.wait",
        "fingerprints of DTensor outputs",
        lambda: callable(getattr(_async_collective_tensor(), "wait", None)),
    )
)


# -- op sequences (replay.bundle_ops: the aten ops an incident's site runs) -------------------------------------
PYTHON_DISPATCH = "torch.utils._python_dispatch"


def dispatch_mode_base() -> type:
    """``TorchDispatchMode``, the base class of a mode that sees every aten op below autograd (imports its module,
    which torch loads anyway)."""
    import importlib

    found = getattr(importlib.import_module(PYTHON_DISPATCH), "TorchDispatchMode", None)
    if not isinstance(found, type):
        raise ConfigError(_DISPATCH_MODE_API.message())
    return found


def _dispatch_mode_present() -> bool:
    try:
        dispatch_mode_base()
    except (ConfigError, ImportError):
        return False
    return True


_DISPATCH_MODE_API = PrivateApi(
    PYTHON_DISPATCH + ".TorchDispatchMode", "incident capture (sdc incident's op sequence)", _dispatch_mode_present
)
_APIS.append(_DISPATCH_MODE_API)


def private_apis() -> tuple[PrivateApi, ...]:
    """Every private torch API this module relies on."""
    return tuple(_APIS)


def missing_apis() -> list[PrivateApi]:
    """The private APIs this torch lacks or has in another shape (none on the pinned torch)."""
    return [api for api in _APIS if not api.present()]
