"""The torchtitan internals the torchtitan examples rely on (workload/titan_internals.py) exist in the shape they
expect; after an upgrade that removes or changes one, this fails naming it."""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra (make venv installs it)")

from workload import titan_internals  # noqa: E402


def test_every_torchtitan_internal_is_present() -> None:
    missing = [api.message() for api in titan_internals.missing_apis()]
    assert not missing, "\n".join(missing)


def test_each_api_names_itself_and_the_feature_that_needs_it() -> None:
    for api in titan_internals.private_apis():
        assert api.name in api.message() and "torchtitan" in api.message(), api.message()


def test_the_debug_llama3_attends_with_sdpa_through_separate_projections() -> None:
    """One layer of the debug flavour, built for real: torchtitan's modules, our two swaps, a causal forward."""
    import torch
    from torchtitan.models.common.attention import QKVLinear, ScaledDotProductAttention

    config = titan_internals.debug_llama3(titan_internals.parallel_dims_of(1, 1)[1])
    config.layers = config.layers[:1]
    torch.manual_seed(0)
    model = config.build()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    attention = model.layers["0"].attention
    assert isinstance(attention.inner_attention, ScaledDotProductAttention)
    assert isinstance(attention.qkv_linear, QKVLinear)
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()} | {
        n for n, _ in model.named_buffers() if n in model.state_dict()
    }  # no hook renames a key: DCP maps each back to its module
    tokens = torch.randint(2048, (1, 8), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)  # (B, T, V)
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 2048
    # Causal: a later token never changes an earlier position's logits.
    assert torch.equal(model(changed)[0, :5], logits[0, :5])
    assert not torch.equal(model(changed)[0, 5], logits[0, 5])


def test_each_expert_computes_what_torchtitans_grouped_experts_compute_for_its_rows() -> None:
    """One layer of the cut Qwen3-MoE, built for real: after `expert_sites`, its grouped experts run expert by
    expert through ``layers.0.moe.experts.G`` modules, bit for bit torchtitan's grouped product, an expert with no
    row included (its output has zero rows)."""
    import torch

    from tracer.sites import find_sites

    shape = titan_internals.MoeShape(layers=1, experts=4, top_k=2, hidden=16)
    torch.manual_seed(0)
    model = titan_internals.debug_qwen3_moe(titan_internals.parallel_dims_of(1, 1)[1], shape).build()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    grouped = model.layers["0"].moe.routed_experts.inner_experts
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(1))  # (R, D), expert-major
    tokens = torch.tensor([3, 0, 1, 3])
    expected = grouped(x, tokens)
    titan_internals.expert_sites(model, first=0)
    outputs: dict[str, torch.Size] = {}
    for name, expert in model.layers["0"].moe.experts.items():
        expert.register_forward_hook(lambda m, args, out, name=name: outputs.update({name: out.shape}))
    assert torch.equal(grouped(x, tokens), expected)
    assert outputs == {"0": (3, 256), "1": (0, 256), "2": (1, 256), "3": (3, 256)}, outputs
    # The default sites: the layer's attention and its whole MoE (after the combine), by structure.
    assert [n for n, _ in find_sites(model)] == ["layers.0.attention", "layers.0.moe"]
