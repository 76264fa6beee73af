"""SiteHooks: every site's output and input gradient, whatever its calling convention, and replacing them."""

from __future__ import annotations

import sys
import warnings
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from tracer.errors import CaptureError, TraceWarning
from tracer.site_hooks import SiteHooks, site_input, site_output


class KeywordAttention(nn.Module):
    """Called as ``attn(hidden_states=x, mask=m)``; returns ``(output, weights)`` like Hugging Face attention."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        return self.proj(hidden_states).tanh(), None


class Net(nn.Module):
    def __init__(self, dim: int = 6) -> None:
        super().__init__()
        self.first = nn.Linear(dim, dim)  # fed the raw input, which does not require grad
        self.attn = KeywordAttention(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        mask = torch.ones(x.shape[0], dtype=torch.bool)
        h = h + self.attn(hidden_states=h, mask=mask)[0]
        return self.head(h)


def sites(net: Net) -> list[tuple[str, nn.Module]]:
    return [("first", net.first), ("attn", net.attn)]


def net_and_input() -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    return Net(), torch.randn(4, 6)


def keep(store: dict[str, torch.Tensor]):
    """A callback that keeps a copy of each site's tensor and replaces nothing."""

    def callback(site: str, t: torch.Tensor) -> None:
        store[site] = t.detach().clone()

    return callback


def test_keyword_and_no_grad_inputs_give_their_true_input_gradient() -> None:
    net, x = net_and_input()
    outputs: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    with SiteHooks(sites(net), on_output=keep(outputs), on_input_grad=keep(grads)) as hooks:
        net(x).sum().backward()
    assert set(outputs) == set(grads) == {"first", "attn"} and hooks.unrecordable == {}
    # What autograd computes without hooks: d(loss)/dx, and d(loss)/dh through the attention alone.
    xr = x.clone().requires_grad_()
    assert torch.equal(grads["first"], torch.autograd.grad(net(xr).sum(), xr)[0])
    h = net.first(x).detach().requires_grad_()
    a = net.attn(hidden_states=h)[0]
    assert torch.equal(grads["attn"], torch.autograd.grad(net.head(h.detach() + a).sum(), h)[0])
    assert torch.equal(outputs["first"], net.first(x)) and torch.equal(outputs["attn"], a)
    # Every hook is gone afterwards and the raw input did not start requiring grad.
    assert not x.requires_grad
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_replacing_an_output_changes_what_flows_on_and_gradients_still_reach_the_site() -> None:
    net, x = net_and_input()
    plain = net(x)
    zeros = torch.zeros(4, 6)
    with SiteHooks(sites(net), on_output=lambda s, t: zeros if s == "attn" else None):
        out = net(x)
        out.sum().backward()
    # The attention's output was replaced by zeros: only the residual path is left.
    assert torch.equal(out, net.head(net.first(x)))
    assert not torch.equal(out, plain)
    # Gradients flow into the site as if it had produced the zeros itself.
    assert net.attn.proj.weight.grad is not None and net.attn.proj.weight.grad.abs().sum() > 0


def test_replacing_an_input_gradient_changes_upstream_parameter_gradients() -> None:
    net, x = net_and_input()
    net(x).sum().backward()
    plain = net.first.weight.grad.clone()
    net.zero_grad()
    seen = []
    with SiteHooks(sites(net), on_input_grad=lambda s, g: seen.append(s) or (g * 0 if s == "attn" else None)):
        net(x).sum().backward()
    assert seen == ["attn", "first"]  # backward order
    # With the attention's input gradient zeroed, `first` gets only the residual path's gradient.
    h = net.first(x)
    expected = torch.autograd.grad(net.head(h + net.attn(hidden_states=h.detach())[0]).sum(), net.first.weight)[0]
    assert torch.equal(net.first.weight.grad, expected) and not torch.equal(net.first.weight.grad, plain)


def test_a_tensor_taken_several_times_is_tapped_once_and_its_whole_gradient_replaced() -> None:
    """``self_attn(x, x, x)``: one input gradient, the sum over the three uses, and a replacement is all that
    flows back into x. A float mask that does not require grad is no input of the site's gradient."""
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, batch_first=True)
    x, mask = torch.randn(2, 5, 8, requires_grad=True), nn.Transformer.generate_square_subsequent_mask(5)
    expected = torch.autograd.grad(attn(x, x, x, attn_mask=mask)[0].sum(), x)[0]
    grads: dict[str, torch.Tensor] = {}
    with SiteHooks([("attn", attn)], on_input_grad=keep(grads)):
        attn(x, x, x, attn_mask=mask)[0].sum().backward()
    assert set(grads) == {"attn"} and torch.equal(grads["attn"], expected) and torch.equal(x.grad, expected)
    x.grad = None
    with SiteHooks([("attn", attn)], on_input_grad=lambda s, g: torch.full_like(g, 2.0)):
        attn(x, x, x, attn_mask=mask)[0].sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


def test_each_other_input_that_requires_grad_reports_its_own_gradient_by_index() -> None:
    """Cross-attention ``attn(x, key=memory, value=memory)``: x's gradient as ``cross``, memory's as ``cross[1]``."""
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, batch_first=True)
    x, memory = torch.randn(2, 5, 8, requires_grad=True), torch.randn(2, 3, 8, requires_grad=True)
    grads: dict[str, torch.Tensor] = {}
    with SiteHooks([("cross", attn)], on_input_grad=keep(grads)):
        attn(x, key=memory, value=memory)[0].sum().backward()
    assert set(grads) == {"cross", "cross[1]"}
    assert torch.equal(grads["cross"], x.grad) and torch.equal(grads["cross[1]"], memory.grad)
    x.grad = memory.grad = None
    with SiteHooks([("cross", attn)], on_input_grad=lambda s, g: torch.full_like(g, float(len(s)))):
        attn(x, key=memory, value=memory)[0].sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 5.0)) and torch.equal(memory.grad, torch.full_like(memory, 8.0))


def test_a_tensor_that_requires_grad_nested_in_an_argument_is_named_once() -> None:
    class Mixer(nn.Module):
        def forward(self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return x * pair[0] + pair[1]

    x, a, b = (torch.ones(3, requires_grad=True) for _ in range(3))
    with pytest.warns(TraceWarning, match=r"site mix: its argument 1 \(tuple\) holds a tensor that requires grad") as w:
        with SiteHooks([("mix", Mixer())], on_input_grad=lambda s, g: None) as hooks:
            for _ in range(2):
                hooks.sites[0][1](x, (a, b)).sum().backward()
    assert len(w) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SiteHooks([("mix", Mixer())], on_input_grad=lambda s, g: None) as hooks:
            hooks.sites[0][1](x, (a.detach(), b.detach())).sum().backward()


@dataclass
class Out:
    hidden: torch.Tensor
    extra: torch.Tensor


Pair = namedtuple("Pair", "a b")


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t,
        lambda t: (None, t, t * 2),
        lambda t: [t, t * 2],
        lambda t: {"loss": None, "hidden": t, "other": t * 2},
        lambda t: Out(t, t * 2),
        lambda t: Pair(t, t * 2),
    ],
    ids=["tensor", "tuple", "list", "dict", "dataclass", "namedtuple"],
)
def test_the_output_tensor_is_the_one_that_flows_on_and_a_replacement_keeps_the_structure(make) -> None:
    t = torch.arange(3.0)
    output = make(t)
    key, primary = site_output(output)
    assert primary is t
    new = torch.full((3,), 7.0)

    class Site(nn.Module):
        def forward(self, x: torch.Tensor):
            return make(x)

    site = Site()
    with SiteHooks([("s", site)], on_output=lambda s, o: new):
        rebuilt = site(t)
    assert type(rebuilt) is type(output)
    assert site_output(rebuilt)[1] is new and site_output(rebuilt)[0] == key
    # The rest is the site's own.
    rest, expected = [v for v in _values(rebuilt) if v is not new], [v for v in _values(output) if v is not t]
    assert len(rest) == len(expected)
    assert all(a is b is None or torch.equal(a, b) for a, b in zip(rest, expected))


def _values(output) -> list:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return list(output.values())
    return list(vars(output).values()) if isinstance(output, Out) else list(output)


def test_a_hugging_face_model_output_is_rebuilt() -> None:
    from transformers.modeling_outputs import BaseModelOutputWithPast

    class Site(nn.Module):
        def forward(self, x: torch.Tensor) -> BaseModelOutputWithPast:
            return BaseModelOutputWithPast(last_hidden_state=x * 2)

    x = torch.ones(2, 3, requires_grad=True)
    with SiteHooks([("s", Site())], on_output=lambda s, o: torch.zeros_like(o)) as hooks:
        out = hooks.sites[0][1](x)
    assert isinstance(out, BaseModelOutputWithPast) and torch.equal(out.last_hidden_state, torch.zeros(2, 3))
    assert torch.equal(out["last_hidden_state"], torch.zeros(2, 3))
    out.last_hidden_state.sum().backward()
    assert torch.equal(x.grad, torch.full((2, 3), 2.0))  # straight through to the site's own output


def test_the_site_input_is_the_first_float_tensor_positional_then_keyword() -> None:
    ids, h, m = torch.tensor([1, 2]), torch.ones(2), torch.zeros(2)
    assert site_input((ids, h), {"mask": m}) == (1, h)
    assert site_input((ids,), {"hidden_states": h, "mask": m})[0] == "hidden_states"
    assert site_input((ids,), {"n": 3}) == ((), None)


def test_a_site_with_only_an_integer_input_is_reported_once() -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    reported = []
    with SiteHooks(
        [("emb", emb)],
        on_output=lambda s, o: None,
        on_input_grad=lambda s, g: None,
        on_unrecordable=lambda s, why: reported.append((s, why)),
    ) as hooks:
        for _ in range(3):
            emb(torch.tensor([1, 2])).sum().backward()
    assert reported == [("emb", "it has no floating-point tensor input (positional or keyword)")]
    assert hooks.unrecordable == dict(reported)


def test_a_site_whose_output_does_not_depend_on_its_input_is_reported() -> None:
    class Detached(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.detach() * 2

    reported = []
    with SiteHooks(
        [("d", Detached())], on_input_grad=lambda s, g: None, on_unrecordable=lambda s, why: reported.append(s)
    ) as hooks:
        hooks.sites[0][1](torch.ones(2))
    assert reported == ["d"] and "differentiably" in hooks.unrecordable["d"]


def test_a_site_that_modifies_its_input_in_place_is_reported_and_the_sites_around_it_record() -> None:
    """The in-place op leaves the input view's gradient hook without a gradient to report."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    grads, reported = [], []
    with SiteHooks(
        [("relu", net[1]), ("out", net[2])],
        on_input_grad=lambda s, g: grads.append(s),
        on_unrecordable=lambda s, why: reported.append((s, why)),
    ):
        for _ in range(2):
            net(torch.randn(4, 3)).sum().backward()
    assert reported == [("relu", "it modifies its input in place")] and grads == ["out", "out"]


def test_a_replacement_of_the_wrong_shape_is_a_clear_error() -> None:
    net, x = net_and_input()
    with SiteHooks(sites(net), on_output=lambda s, t: torch.zeros(2)):
        with pytest.raises(CaptureError, match=r"site first: .*shape"):
            net(x)
    with SiteHooks(sites(net), on_input_grad=lambda s, g: g[:1]):
        with pytest.raises(CaptureError, match=r"site attn: .*input gradient"):
            net(x).sum().backward()


def dynamo_calls(run) -> int:  # noqa: ANN001 - a function of no arguments
    """How many Python functions of torch._dynamo run while ``run()`` does."""
    count = 0

    def profile(frame, event, arg) -> None:  # noqa: ANN001
        nonlocal count
        if event == "call" and "torch/_dynamo/" in frame.f_code.co_filename.replace("\\", "/"):
            count += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.slow  # a compile of a few seconds
def test_hooks_cost_eager_code_no_compile_wrapper_and_run_as_they_are_under_compile() -> None:
    import torch._dynamo  # noqa: F401 - loaded, as by any optimizer step: the hooks get their twins

    net, x = net_and_input()
    seen: list[str] = []
    grads: list[str] = []
    with SiteHooks(sites(net), on_output=lambda s, t: seen.append(s), on_input_grad=lambda s, g: grads.append(s)):
        net(x).sum().backward()  # warm: autograd's first backward imports what it needs
        assert dynamo_calls(lambda: net(x).sum().backward()) == 0
        assert seen == ["first", "attn"] * 2 and grads == ["attn", "first"] * 2
        seen.clear(), grads.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = torch.compile(net, backend="eager")
            for _ in range(2):
                compiled(x).sum().backward()
    # Dynamo runs the hooks as they are (not traced into, no warning from inside them), at every call.
    assert seen == ["first", "attn"] * 2 and grads == ["attn", "first"] * 2
    assert not [w for w in caught if "site_hooks" in str(w.filename)], [str(w.message)[:200] for w in caught]
