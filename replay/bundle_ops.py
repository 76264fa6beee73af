"""The aten op sequence of one module forward, recorded so that replay/bundle_reproduce.py can run it again.

    recorder = OpRecorder(inputs={"input.0": x}, named={"param.weight": w})
    with recorder:                       # a TorchDispatchMode: sees every aten op below autograd
        y = module(x)
    recorder.output_refs([y])            # ["op.3.0"]
    recorder.ops, recorder.constants     # the manifest's op list; tensors the ops read that came from elsewhere

Each op is its overload name (``aten.mm.default``), the submodule it ran in (``w1``; "" for the module itself),
its arguments with every tensor replaced by a reference
(``input.0``, ``param.weight``, ``const.2`` or ``op.K.J``, the J-th tensor result of op K), and the shapes,
dtypes and strides of what it reads and writes. A tensor the ops read that is neither an input, a named tensor
nor an earlier result (a mask built outside the module) is kept as a constant with its value at first use, and so
is the state of a generator of the model's own that an op draws from (`draw_afresh` drops it where the model seeds
that generator at run time, so that each run of the bundle draws anew, as the model does).
sdctrace's own ops (`tracer.intercept.own_ops`: the Tracer's fingerprints) are not recorded. An op outside torch's
own namespaces (`bundle_reproduce.NAMESPACES`: a custom op, whose code would not travel with the bundle) is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from replay.bundle_check import NAMESPACES
from replay.bundle_reproduce import flatten
from tracer.errors import ValidationError
from tracer.intercept import in_own_ops
from tracer.torch_internals import dispatch_mode_base


def describe_tensor(t: torch.Tensor) -> dict[str, Any]:
    """Shape, stride and dtype: what the manifest says of every tensor."""
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch.")}


class OpRecorder(dispatch_mode_base()):  # type: ignore[misc]  # a base a call returns (torch's private mode class)
    """Records the ops run while active; ``inputs`` and ``named`` are the tensors it names by reference."""

    def __init__(
        self, inputs: dict[str, torch.Tensor], named: dict[str, torch.Tensor], module: Callable[[], str] = lambda: ""
    ) -> None:
        super().__init__()
        self._module = module  # the path, below the recorded module, of the submodule running now ("": itself)
        self.ops: list[dict[str, Any]] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.seeds: list[int] = []  # the initial seed of each generator of the model's own an op drew from, in order
        self._refs: dict[int, str] = {}
        self._alive: list[torch.Tensor] = []  # every tensor referred to, so that no id is reused
        for name, t in {**inputs, **named}.items():
            self._name(t, name)

    def _name(self, t: torch.Tensor, ref: str) -> None:
        self._refs[id(t)] = ref
        self._alive.append(t)

    def ref(self, t: torch.Tensor) -> str:
        """The reference of a tensor an op reads; a new constant if it came from outside."""
        ref = self._refs.get(id(t))
        if ref is None:
            ref = f"const.{len(self.constants)}"
            self.constants[ref] = t.detach().clone()
            self._name(t, ref)
        return ref

    def encode(self, value: Any, reads: list[str]) -> Any:
        """An argument in manifest form (replay/bundle_reproduce.py's `decode`)."""
        if isinstance(value, torch.Tensor):
            reads.append(self.ref(value))
            return {"t": reads[-1]}
        if isinstance(value, (list, tuple)):
            return [self.encode(v, reads) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": repr(value)}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.Generator):  # the model's own: the state it draws from, kept as a constant
            ref = f"const.{len(self.constants)}"
            self.constants[ref] = value.get_state()
            self.seeds.append(value.initial_seed())
            return {"generator": {"device": value.device.type, "state": ref}}
        if isinstance(value, torch.device):
            return {"device": value.type}
        for kind, cls in (("dtype", torch.dtype), ("layout", torch.layout), ("memory_format", torch.memory_format)):
            if isinstance(value, cls):
                return {kind: str(value).removeprefix("torch.").split(":")[0]}
        raise ValidationError(
            f"incident capture cannot write down the argument {value!r} of type "
            f"{type(value).__name__} (ops so far: {len(self.ops)})"
        )

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if in_own_ops():
            return func(*args, **kwargs)
        if func.namespace not in NAMESPACES:
            raise ValidationError(
                f"incident capture: the site runs {func}, an op of the namespace {func.namespace!r}; "
                f"a bundle runs torch's own operators only ({', '.join(sorted(NAMESPACES))}), as a "
                "custom op's code does not travel with it"
            )
        reads: list[str] = []
        entry = {
            "op": str(func),
            "args": self.encode(list(args), reads),
            "kwargs": {k: self.encode(v, reads) for k, v in kwargs.items()},
        }
        read_meta = {r: describe_tensor(t) for r, t in _tensors(args, kwargs, self._refs)}
        out = func(*args, **kwargs)
        k = len(self.ops)
        results = []
        for j, t in enumerate(flatten(out)):
            if isinstance(t, torch.Tensor):
                self._name(t, f"op.{k}.{j}")
                results.append({"ref": f"op.{k}.{j}", **describe_tensor(t)})
        self.ops.append(
            {**entry, "module": self._module(), "reads": sorted(set(reads)), "read_meta": read_meta, "results": results}
        )
        return out

    def output_refs(self, outputs: list[torch.Tensor]) -> list[str]:
        """The references of the module's output tensors (each an op result, an input or a named tensor)."""
        missing = [i for i, t in enumerate(outputs) if id(t) not in self._refs]
        if missing:
            raise ValidationError(
                f"incident capture: output {missing[0]} of the site is no tensor its ops made or read"
            )
        return [self._refs[id(t)] for t in outputs]


def _tensors(args: tuple, kwargs: dict, refs: dict[int, str]) -> list[tuple[str, torch.Tensor]]:
    found = [t for t in flatten([*args, *kwargs.values()]) if isinstance(t, torch.Tensor)]
    return [(refs[id(t)], t) for t in found if id(t) in refs]


class GeneratorSeeds(dispatch_mode_base()):  # type: ignore[misc]  # a base a call returns (as OpRecorder's)
    """While active, the initial seed of every generator of the model's own that an op draws from, in order: the
    suspect's forward beside the golden one's `OpRecorder.seeds` tells a generator the model seeds at run time
    (the clock, an OS source) from one seeded alike on every run."""

    def __init__(self) -> None:
        super().__init__()
        self.seeds: list[int] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(kwargs.get("generator"), torch.Generator) and not in_own_ops():
            self.seeds.append(kwargs["generator"].initial_seed())
        return func(*args, **kwargs)


def draw_afresh(ops: list[dict[str, Any]], constants: dict[str, torch.Tensor]) -> int:
    """Make every own-generator argument of ``ops`` draw from a freshly seeded generator when the bundle is run
    (its captured state dropped from ``constants``): for a generator the model seeds differently on every run, so
    that reproduce.py shows the variation the model has. The number of such arguments."""
    count = 0

    def visit(value: Any) -> Any:
        nonlocal count
        if isinstance(value, list):
            return [visit(v) for v in value]
        if isinstance(value, dict) and set(value) == {"generator"}:
            count += 1
            constants.pop(value["generator"].get("state", ""), None)
            return {"generator": {"device": value["generator"]["device"]}}
        return value

    for op in ops:
        op["args"] = visit(op["args"])
        op["kwargs"] = {k: visit(v) for k, v in op["kwargs"].items()}
    return count
