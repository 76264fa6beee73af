"""Per-site hooks that see every site's output and input gradient, whatever its calling convention.

    def on_output(site: str, output: torch.Tensor) -> torch.Tensor | None: ...      # None: keep it
    def on_input_grad(site: str, grad: torch.Tensor) -> torch.Tensor | None: ...    # None: keep it
    with SiteHooks(find_sites(model), on_output=on_output, on_input_grad=on_input_grad):
        model(x).sum().backward()

The Tracer records through it, and replay's lockstep overwrites each site's tensors
with the golden ones through the same two callbacks, so that no gradient leaves a
lockstep site but a golden one. What a site's tensors are:

- its *input* is the first floating-point tensor among the positional arguments,
  else the first among the keyword arguments in call order (Hugging Face decoder
  layers call ``self_attn(hidden_states=...)``). Where the same tensor is passed
  again (``nn.MultiheadAttention`` is called as ``self_attn(x, x, x)``), every
  occurrence gets the one tapped view, so its gradient is the sum over all uses
  and a replacement is all that flows back into it.
- every *other* distinct floating-point tensor argument that requires grad
  (cross-attention's ``memory`` in ``multihead_attn(x, memory, memory)``, a
  ``residual``) is tapped too, since its gradient leaves the site as well: the
  k-th such tensor, in call order, reports as site ``name[k]``
  (``decoder.layers.0.multihead_attn[1]``). Arguments that do not require grad
  (masks, position tables) are not tapped, nor are tensors nested in a tuple,
  list or mapping argument: one that requires grad is named once in a
  ``TraceWarning``. A site whose only such argument is its input pays one scan
  of its arguments for this and records exactly what it did before.
- its *output* is the tensor that flows on: the output itself, the first tensor of a
  tuple or list, the first tensor field of a dataclass (Hugging Face ``ModelOutput``),
  or the first tensor value of a mapping. A replacement is put back into a copy of
  the same structure.

Why not ``register_full_backward_hook``: it sees only positional inputs, and only
those that require grad, so keyword-called attention and a first layer fed raw data
would record no gradient. Here a forward pre-hook passes the site a view of its
input with a tensor hook that reports (and may replace) the gradient; when the input
does not require grad, it passes through an identity autograd function instead,
with a scalar "anchor" that does, so autograd computes the site's input gradient
anyway.

Like any hook that adds autograd nodes, this can change the order in which
gradients are summed: trace a healthy and a suspect run at the same sites.
A site that can still not give an input gradient (its only tensor input is an
integer tensor, its output does not depend on its input differentiably, or it
modifies its input in place, as ``nn.ReLU(inplace=True)`` does) is reported once
through ``on_unrecordable``.

The callbacks know nothing of steps or microbatches: read those from your own
clock (the Tracer's ``step_index`` and ``microbatch_index``). ``on_input_grad``
runs inside the backward pass, ``on_output`` inside the forward; sdctrace's own
tensor work here runs in `tracer.intercept.own_ops`, which fault emulators skip.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.compiler import is_dynamo_compiling
from torch.utils.hooks import RemovableHandle

from tracer.compiled import disabled_twin
from tracer.errors import CaptureError, TraceWarning
from tracer.intercept import own_ops
from tracer.parallel import refuse_context_parallel
from tracer.sharding import as_shard_of, local_shard
from tracer.torch_internals import version_counter

OutputCallback = Callable[[str, torch.Tensor], torch.Tensor | None]
"""``(site, output) -> replacement or None``: runs after the site's forward.

A replacement must have the output's shape, dtype and device. Its values flow on;
gradients flow back into the site as if the site had produced them (never into the
replacement's own graph)."""

InputGradCallback = Callable[[str, torch.Tensor], torch.Tensor | None]
"""``(site, grad) -> replacement or None``: runs in the backward pass once the gradient
w.r.t. the site input is complete (``site`` is ``name[k]`` for the site's k-th other input).
A replacement (same shape, dtype, device) is what flows on to the layers before the site."""

UnrecordableCallback = Callable[[str, str], None]
"""``(site, reason)``: called once per site that cannot give an input gradient."""

# Where the primary tensor sits in an argument list or output: an index, a keyword or field name, or
# () for a bare tensor.
_Key = int | str | tuple[()]


class SiteHooks:
    """Install the callbacks on ``sites`` (``(path, module)`` pairs) while the ``with`` block runs.

    Hooks go after any the modules already have, so ``on_output`` sees the output
    that earlier forward hooks left. ``on_input_grad=None`` adds no autograd node.
    """

    def __init__(
        self,
        sites: Sequence[tuple[str, nn.Module]],
        *,
        on_output: OutputCallback | None = None,
        on_input_grad: InputGradCallback | None = None,
        on_unrecordable: UnrecordableCallback | None = None,
    ) -> None:
        self.sites = list(sites)
        self._on_output = on_output
        self._on_input_grad = on_input_grad
        self._on_unrecordable = on_unrecordable
        self.unrecordable: dict[str, str] = {}  # site -> why it gives no input gradient
        self._checked: set[str] = set()  # sites whose first forward under autograd has been seen
        # site -> per forward, (input view, its version) per tapped input
        self._taps: dict[str, list[tuple[tuple[torch.Tensor, int], ...]]] = {}
        self._anchors: dict[torch.device, torch.Tensor] = {}
        self._reporters: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}  # name[k] -> its gradient's reporter
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> SiteHooks:
        try:
            for name, module in self.sites:
                if self._on_input_grad is not None:
                    self._handles.append(module.register_forward_pre_hook(self._tap_input(name), with_kwargs=True))
                if self._on_output is not None or self._on_input_grad is not None:
                    self._handles.append(module.register_forward_hook(self._take_output(name)))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every hook (harmless twice)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- hooks -------------------------------------------------------------------------
    def _tap_input(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any]:
        report = self._input_grad_reporter(name)

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not is_dynamo_compiling():
                refuse_context_parallel()  # before the site runs on a part of the sequence (its attention may fail)
            if not torch.is_grad_enabled():
                return None
            if name not in self._checked:  # the site's first forward under autograd
                _warn_nested(name, args, kwargs)
            key, x = site_input(args, kwargs)
            if x is None:
                self._unrecordable(name, "it has no floating-point tensor input (positional or keyword)")
                return None
            with own_ops():
                if x.requires_grad:
                    # A view's tensor hook costs less than a Python autograd Function.
                    tapped = x.view_as(x)
                    tapped.register_hook(report)
                    taps: tuple[tuple[torch.Tensor, int], ...] = ((tapped, version_counter(tapped)),)
                else:
                    tapped = _InputGrad.apply(x, self._anchor(x.device), report)
                    taps = ()
                if len(args) + len(kwargs) > 1 and _more_inputs(args, kwargs, key, x):
                    args, kwargs, taps = self._tap_others(name, args, kwargs, x, tapped, taps)
                elif isinstance(key, int):
                    args = (*args[:key], tapped, *args[key + 1 :])
                else:
                    assert isinstance(key, str), f"an input found has a position or a name, not {key!r}"
                    kwargs = {**kwargs, key: tapped}
            if taps:
                self._taps.setdefault(name, []).append(taps)
            return args, kwargs

        return hook

    def _tap_others(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        x: torch.Tensor,
        tapped: torch.Tensor,
        taps: tuple[tuple[torch.Tensor, int], ...],
    ) -> tuple[tuple[Any, ...], dict[str, Any], tuple[tuple[torch.Tensor, int], ...]]:
        """Put ``tapped`` wherever the site input ``x`` recurs, and a tapped view in place of every other
        distinct tensor input that requires grad (the k-th reports as ``name[k]``); the new arguments and taps."""
        views: dict[int, torch.Tensor] = {id(x): tapped}
        new_taps = list(taps)

        def tap(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            view = views.get(id(v))
            if view is None and v.requires_grad and v.is_floating_point():
                view = views[id(v)] = v.view_as(v)
                other = f"{name}[{len(views) - 1}]"
                report = self._reporters.get(other)
                if report is None:
                    report = self._reporters[other] = self._input_grad_reporter(other)
                view.register_hook(report)
                new_taps.append((view, version_counter(view)))
            return v if view is None else view

        return tuple(tap(a) for a in args), {k: tap(v) for k, v in kwargs.items()}, tuple(new_taps)

    def _input_grad_reporter(self, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        callback = self._on_input_grad

        def report(grad: torch.Tensor) -> torch.Tensor:
            if twin is not None and is_dynamo_compiling():
                return twin(grad)
            assert callback is not None
            local = local_shard(grad)  # a DTensor's: what this rank holds
            new = callback(name, local)
            if new is None:
                return grad
            _check_replacement(name, "input gradient", local, new)
            return as_shard_of(grad, new)

        twin = disabled_twin(report, "sdctrace fingerprints (or replaces) a site's input gradient here")
        return report

    def _take_output(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], Any]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if twin is not None and is_dynamo_compiling():
                return twin(module, args, output)
            refuse_context_parallel()
            taps = self._taps.get(name)
            if taps:
                for tapped, version in taps.pop():
                    if version_counter(tapped) != version:  # the view's hook would never run
                        self._unrecordable(name, "it modifies its input in place")
                        break
            key, out = site_output(output)
            if out is None:
                if torch.is_grad_enabled():
                    self._unrecordable(name, f"its output ({type(output).__name__}) holds no tensor")
                return None
            if self._on_input_grad is not None and torch.is_grad_enabled() and name not in self._checked:
                self._checked.add(name)
                if not out.requires_grad and name not in self.unrecordable:
                    self._unrecordable(name, "its output does not depend differentiably on its input")
            if self._on_output is None:
                return None
            local = local_shard(out)
            new = self._on_output(name, local)
            if new is None:
                return None
            _check_replacement(name, "output", local, new)
            new = as_shard_of(out, new)
            if out.requires_grad:
                new = substitute(out, new)
            return _rebuilt(output, key, new)

        twin = disabled_twin(hook, "sdctrace fingerprints (or replaces) a site's output here")
        return hook

    def _unrecordable(self, name: str, reason: str) -> None:
        if name in self.unrecordable:
            return
        self.unrecordable[name] = reason
        if self._on_unrecordable is not None:
            self._on_unrecordable(name, reason)

    def _anchor(self, device: torch.device) -> torch.Tensor:
        anchor = self._anchors.get(device)
        if anchor is None:
            anchor = self._anchors[device] = torch.zeros((), device=device, requires_grad=True)
        return anchor


def site_input(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[_Key, torch.Tensor | None]:
    """The site input: the first floating-point tensor among ``args``, else among ``kwargs`` in call order."""
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return i, a
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return k, v
    return (), None


def _more_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any], key: _Key, x: torch.Tensor) -> bool:
    """Whether an argument other than the site input at ``key`` is ``x`` again or a tensor that requires grad."""
    for i, a in enumerate(args):
        if i != key and isinstance(a, torch.Tensor) and (a is x or a.requires_grad):
            return True
    for k, v in kwargs.items():
        if k != key and isinstance(v, torch.Tensor) and (v is x or v.requires_grad):
            return True
    return False


def _warn_nested(site: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Say once that a gradient can leave the site through a tensor nested in an argument, which is not tapped."""
    for where, value in [*enumerate(args), *kwargs.items()]:
        items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
        if any(isinstance(v, torch.Tensor) and v.requires_grad for v in items):
            warnings.warn(
                f"site {site}: its argument {where!r} ({type(value).__name__}) holds a tensor that requires grad; "
                "its gradient is neither recorded nor replaced at the site (only tensors passed as arguments of "
                "their own are), so lockstep compares it only downstream: pass it as an argument of its own",
                TraceWarning,
                stacklevel=3,
            )
            return


def site_output(output: Any) -> tuple[_Key, torch.Tensor | None]:
    """The tensor that flows on from a site's output, and where it sits (see the module docstring)."""
    if isinstance(output, torch.Tensor):
        return (), output
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        for f in dataclasses.fields(output):
            v = getattr(output, f.name)
            if isinstance(v, torch.Tensor):
                return f.name, v
        return (), None
    if isinstance(output, Mapping):
        for k, v in output.items():
            if isinstance(v, torch.Tensor):
                return k, v
        return (), None
    if isinstance(output, (tuple, list)):
        for i, v in enumerate(output):
            if isinstance(v, torch.Tensor):
                return i, v
    return (), None


def _rebuilt(output: Any, key: _Key, new: torch.Tensor) -> Any:
    """A copy of ``output`` with ``new`` at ``key``; the original structure is left alone."""
    if key == ():
        return new
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        assert isinstance(key, str)
        return dataclasses.replace(output, **{key: new})
    if isinstance(output, Mapping):
        out: Any = copy.copy(output)  # of the output's own type, a mapping the model can write into
        out[key] = new
        return out
    assert isinstance(key, int)
    items = [new if i == key else v for i, v in enumerate(output)]
    if isinstance(output, list):
        return items
    return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)  # namedtuple or tuple


def _check_replacement(site: str, what: str, old: torch.Tensor, new: Any) -> None:
    if not isinstance(new, torch.Tensor):
        raise CaptureError(f"site {site}: the {what} callback returned {type(new).__name__}; return a tensor or None")
    found, expected = (tuple(new.shape), new.dtype, new.device), (tuple(old.shape), old.dtype, old.device)
    if found != expected:
        raise CaptureError(
            f"site {site}: the {what} callback returned shape, dtype, device {found} where the site has "
            f"{expected}; return a tensor like the one it was given, or None to keep it"
        )


class _InputGrad(torch.autograd.Function):
    """Identity on the site input; its backward hands the input gradient to ``report`` and passes on
    what ``report`` returns. ``anchor`` (a scalar leaf that requires grad, or None) makes autograd
    compute the gradient of an input that does not require grad itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, anchor: torch.Tensor | None, report: Callable) -> torch.Tensor:
        ctx.report = report
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.report(grad), None, None


def substitute(out: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``new``'s values in place of ``out``'s, with the gradient going back into ``out``'s graph (never into
    ``new``'s): a site's output, or what a pipeline stage received, overwritten by its golden twin."""
    with own_ops():
        return _Substitute.apply(out, new)


class _Substitute(torch.autograd.Function):
    """Forward: the replacement's values. Backward: the gradient goes to the site's own output."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return new.detach().clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None
