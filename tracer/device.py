"""Where training runs, and the step boundary of lazy (XLA) devices.

On an XLA device every op only adds to a graph; the graph is compiled and run when
the step is marked (``torch_xla.sync()``) or when a value is read on the host, which
runs the graph up to that value on its own. sdctrace therefore reads nothing from an
XLA tensor until the step is marked, and then reads everything it needs in one
transfer (docs/xla.md). torch_xla is imported only when an XLA device is asked for:
it needs the torch release it was built against (``make test-xla``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from importlib import metadata

import torch

from tracer.errors import UsageError

DEVICES = ("cpu", "cuda", "xla")


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda[:N]`` or ``xla[:N]`` as a torch device, or a UsageError that says what is missing."""
    kind = name.split(":", 1)[0]
    if kind not in DEVICES:
        raise UsageError(f"--device {name!r}: expected one of {', '.join(DEVICES)} (optionally with :N)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: this torch build ({torch.__version__}) sees no CUDA device")
    if kind == "xla":
        try:
            import torch_xla
        except ImportError as e:
            raise UsageError(
                f"--device {name}: torch_xla is not importable ({e}); it needs the torch release it was "
                f"built against, which this environment does not have: see docs/xla.md (make test-xla)"
            ) from None
        return torch_xla.device(int(name.split(":", 1)[1]) if ":" in name else None)
    return torch.device(name)


def is_lazy(device: torch.device) -> bool:
    """True where ops are traced into a graph that runs at the step mark (XLA)."""
    return device.type == "xla"


def mark_step(device: torch.device) -> None:
    """End the step's graph on a lazy device: compile (cached) and run it. Elsewhere nothing."""
    if is_lazy(device):
        import torch_xla

        torch_xla.sync()


def to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copy tensors to the CPU in one transfer per dtype (a device sync each); on XLA in one batched
    transfer that runs no new graph for tensors the last step mark already computed."""
    if not tensors:
        return []
    if is_lazy(tensors[0].device):
        import torch_xla

        return list(torch_xla._XLAC._xla_get_cpu_tensors(list(tensors)))
    out: list[torch.Tensor | None] = [None] * len(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for idx in by_dtype.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in idx]).cpu()
        for i, part in zip(idx, flat.split([tensors[i].numel() for i in idx])):
            out[i] = part.reshape(tensors[i].shape)
    return out  # type: ignore[return-value]  # every slot filled: each index is in one dtype's group


def device_versions(device: torch.device) -> dict[str, str]:
    """Versions of the device's software stack beyond torch, for the run header."""
    if device.type == "xla":
        return {"torch_xla": metadata.version("torch-xla")}
    if device.type == "cuda":
        return {"cuda": str(torch.version.cuda)}
    return {}


def device_determinism(device: torch.device) -> dict[str, str]:
    """Settings beyond torch's that decide a device's bits: on XLA the compiler's flags."""
    if device.type == "xla":
        return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "pjrt_device": os.environ.get("PJRT_DEVICE", "")}
    return {}


def reinterpret(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 1-d tensor's bits as ``dtype`` (``t.view(dtype)``), its byte count a multiple of
    ``dtype``'s size. On XLA an XLA bitcast: torch_xla runs ``view(dtype)`` on the host."""
    if not is_lazy(t.device):
        return t.view(dtype)
    import torch_xla.core.xla_builder as xb

    ratio = dtype.itemsize // t.element_size()
    if ratio > 1:  # XLA bitcasts a trailing dimension of `ratio` narrow elements into one wide one
        t = t.reshape(-1, ratio)
    return _xla_bitcast()(t, to_type=xb.Op.from_torch_type(dtype)).reshape(-1)


@functools.cache
def _xla_bitcast() -> Callable[..., torch.Tensor]:  # a torch_xla op
    import torch_xla.core.xla_op_registry as xor

    return xor.register("sdctrace_bitcast", lambda x, to_type: x.bitcast(to_type))
