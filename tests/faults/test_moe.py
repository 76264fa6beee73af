"""Mixture-of-experts layers: Hugging Face's Mixtral multiplies every expert in one ``_grouped_mm`` call, which
the ``matmul`` family names, so a one-element rule corrupts one element of each grouped call (not one per expert:
the CPU kernel's inner ``mm`` calls run below the emulator)."""

from __future__ import annotations

import pytest
import torch

from faults.emulator import FaultEmulator
from faults.profile import _profile

pytest.importorskip("transformers")


def test_a_matmul_rule_hits_each_grouped_expert_call_once() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(
        MixtralConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=16,
        )
    )
    rule = {
        "ops": ["matmul"],
        "sites": r"model\.layers\.0\.mlp\.experts",
        "phases": ["forward"],
        "p_call": 1.0,
        "elements": 1,
        "kind": "scale",
        "factor": 10.0,
    }
    profile = _profile("moe", {"seed": 1, "fault": [rule]}, "test")
    faults: list[dict] = []
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with FaultEmulator(profile, model, clock=lambda: (0, 0), sink=lambda kind, fields: faults.append(fields)):
        model(input_ids=ids, labels=ids).loss.backward()
    # The experts' two grouped products (gate/up, then down): one fault each, one element each.
    assert [(f["op"], f["site"]) for f in faults] == [("aten._grouped_mm.default", "model.layers.0.mlp.experts")] * 2
    assert all(f["elements"] == 1 for f in faults)


def test_abft_checks_each_expert_of_a_grouped_call_and_flags_the_corrupted_one() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    from faults.abft import AbftChecker

    torch.manual_seed(0)
    model = MixtralForCausalLM(
        MixtralConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=16,
        )
    )
    rule = {
        "ops": ["_grouped_mm"],
        "phases": ["forward"],
        "p_call": 1.0,
        "elements": 1,
        "kind": "scale",
        "factor": 1000.0,
    }
    profile = _profile("moe", {"seed": 1, "fault": [rule]}, "test")
    events: list[tuple[str, dict]] = []
    sink = lambda kind, fields: events.append((kind, fields))  # noqa: E731
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with (
        FaultEmulator(profile, model, clock=lambda: (0, 0), sink=sink),
        AbftChecker(model, clock=lambda: (0, 0), sink=sink),
    ):
        model(input_ids=ids, labels=ids).loss.backward()
    grouped = [(f["phase"], f["verdict"]) for kind, f in events if kind == "abft" and "grouped" in f["op"]]
    # Forward: both grouped products corrupted and flagged; backward: four grouped products (input and weight
    # gradients of each), all checked and consistent, though fed by the corrupted results.
    assert grouped[:2] == [("forward", "flag")] * 2
    assert grouped[2:] == [("backward", "ok")] * 4
    assert sum(kind == "fault" for kind, _ in events) == 2
