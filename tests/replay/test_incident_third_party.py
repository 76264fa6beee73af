"""`sdc certify` and `sdc incident` on models we did not write: tests/integrations/hf_tiny's LlamaForCausalLM
(random init, trained by transformers.Trainer) recorded for 10 steps with checkpoints every 5 and a stuck unit at
step 7 certifies the checkpoint of step 5, its healthy twin the last one (step 10); torch's ``nn.Transformer``
(tests/replay/torch_transformer.py) with an exponent bit stuck in an encoder layer's linear2 gives a bundle that
reproduces *persistent here* under the fault's emulation and *transient* without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import load_profile
from sdc.cli import main
from tests.replay import torch_transformer
from tests.replay.incident_support import assert_persistent_under_emulation_only, down_proj_flip, stuck_bit
from tracer.checkpoint import checkpoint_dir

LINEAR2 = "transformer.encoder.layers.1.linear2"
LINEAR2_FLIP = stuck_bit(LINEAR2, step=1, bit=27)


@pytest.mark.slow
def test_certify_on_an_hf_llama_names_the_checkpoint_before_the_fault(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers", reason="install the extras: pip install -e '.[hf]'")
    from faults.node import node_options
    from tests.integrations import hf_tiny

    profile = tmp_path / "down-proj.toml"
    profile.write_text(down_proj_flip(7), encoding="utf-8")
    config = {"variant": {"steps": 10, "save_steps": 5}}
    golden = hf_tiny.record(tmp_path / "golden", "golden", config=config)
    sick = hf_tiny.record(tmp_path / "sick", "sick", config=config, **node_options(load_profile(profile)))
    twin = hf_tiny.record(tmp_path / "twin", "twin", config=config)
    capsys.readouterr()  # the Trainer's own lines
    assert main(["certify", str(sick), "--golden", str(golden)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{checkpoint_dir(sick, 5)}\n"
    assert f"certified: step 5 of {sick} (rank 0 diverged from {golden} at step 7" in captured.err
    assert main(["certify", str(twin), "--golden", str(golden)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{checkpoint_dir(twin, 10)}\n" and "every record matched" in captured.err


@pytest.mark.slow
def test_an_nn_transformer_bundle_reproduces_persistent_here_under_its_emulation(tmp_path: Path, capsys) -> None:
    from jobs.record import record_run

    profile = tmp_path / "linear2.toml"
    profile.write_text(LINEAR2_FLIP, encoding="utf-8")
    config = {"model": {"kind": "torch"}, "run": {"steps": 2, "checkpoint_every": 1}}
    workload = torch_transformer.WORKLOAD
    record_run(config, tmp_path / "golden", node_label="golden", workload=workload, progress=False)
    record_run(
        config,
        tmp_path / "sick",
        node_label="sick",
        workload=workload,
        progress=False,
        fault_profile=load_profile(profile),
    )
    bundle = tmp_path / "INC"
    assert (
        main(
            [
                "incident",
                "--golden",
                str(tmp_path / "golden"),
                "--suspect",
                str(tmp_path / "sick"),
                "--out",
                str(bundle),
                "--workload",
                workload,
            ]
        )
        == 0
    )
    assert "bit 27 x1" in capsys.readouterr().out
    manifest = json.loads((bundle / "manifest.json").read_text())
    site = manifest["site"]
    assert (site["step"], site["microbatch"], site["name"], site["phase"]) == (1, 0, LINEAR2, "forward")
    assert manifest["module"] == "Linear" and manifest["checkpoint"] == 1
    (fault,) = manifest["faults"]
    (sig,) = manifest["signatures"]
    assert fault["site"] == LINEAR2 and sig["bits"] == {"27": 1} and sig["positions"] == fault["index"]
    assert_persistent_under_emulation_only(bundle, profile, repeats=2)
