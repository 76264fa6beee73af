"""`sdc incident` on a third-party model: tests/integrations/hf_tiny's LlamaForCausalLM (random init from a
LlamaConfig, no download) trained by transformers.Trainer, with one exponent bit of its layer-1 MLP's down
projection flipped, persistently, at step 2. The bundle names the bit and reproduces under the fault's emulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdc.cli import main
from tests.replay.incident_support import assert_persistent_under_emulation_only, down_proj_flip

pytest.importorskip("transformers", reason="install the extras: pip install -e '.[hf]'")


@pytest.mark.slow
def test_an_hf_llama_bundle_names_the_flipped_bit_and_reproduces(tmp_path: Path, capsys) -> None:
    from faults import load_profile
    from faults.node import node_options
    from tests.integrations import hf_tiny

    profile = tmp_path / "down-proj.toml"
    profile.write_text(down_proj_flip(2), encoding="utf-8")
    golden = hf_tiny.record(tmp_path / "golden", "golden")
    sick = hf_tiny.record(tmp_path / "sick", "sick", **node_options(load_profile(profile)))
    bundle = tmp_path / "INC"
    assert (
        main(
            [
                "incident",
                "--golden",
                str(golden),
                "--suspect",
                str(sick),
                "--out",
                str(bundle),
                "--workload",
                hf_tiny.WORKLOAD,
            ]
        )
        == 0
    )
    assert "bit 27 x1" in capsys.readouterr().out
    manifest = json.loads((bundle / "manifest.json").read_text())
    site = manifest["site"]
    assert (site["step"], site["microbatch"], site["name"], site["phase"]) == (2, 0, hf_tiny.FAULT_SITE, "forward")
    assert manifest["module"] == "LlamaMLP" and manifest["fingerprints"]["golden"] == [
        manifest["fingerprints"]["logged"]
    ]
    assert {op["module"] for op in manifest["ops"]} >= {"gate_proj", "up_proj", "down_proj"}
    (fault,) = manifest["faults"]
    (sig,) = manifest["signatures"]
    assert fault["site"] == hf_tiny.FAULT_SITE + ".down_proj" and fault["detail"]["bits"] == [27]
    assert sig["bits"] == {"27": 1} and sig["fields"]["exponent"] == 1 and sig["differing"] == 1
    assert sig["positions"] == fault["index"] and sig["op"] == "aten.mm.default" and sig["step"] == 2

    assert_persistent_under_emulation_only(bundle, profile, repeats=2)
