"""`sdc incident`: a bundle captured at a real divergence, reproduced in fresh processes with and without the fault's
emulation; the manifest checked against the golden log and the fault events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from replay.bundle_check import read_safetensors
from replay.bundle_reproduce import VERDICTS
from sdc.cli import main
from tests.replay.incident_support import assert_persistent_under_emulation_only, reproduce_py, sdc
from tests.support import ONE_FLIP

# ONE_FLIP (one exponent flip in each forward matmul of layers.1.feed_forward at step 3) as a stuck unit, and as a
# transient one that fires in a step's first run only (a later moment, a re-run, is clean).
PERSISTENT = ONE_FLIP + "persistent = true\n"
TRANSIENT = ONE_FLIP + "attempts = [0]\n"
SITE = (3, 0, "layers.1.feed_forward", "forward")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from faults import load_profile
    from jobs.record import record_run
    from tests.support import small_config

    root = tmp_path_factory.mktemp("incident")
    paths = {"root": root}
    for name, text in (("persistent", PERSISTENT), ("transient", TRANSIENT)):
        (root / f"{name}.toml").write_text(text, encoding="utf-8")
        paths[f"{name}.toml"] = root / f"{name}.toml"
    config = small_config("run.steps=5", "run.checkpoint_every=2")
    for name, profile in (("golden", None), ("persistent", "persistent.toml"), ("transient", "transient.toml")):
        kwargs = {"fault_profile": load_profile(paths[profile])} if profile else {}
        record_run(config, root / name, node_label=name, progress=False, **kwargs)
        paths[name] = root / name
    return paths


@pytest.mark.slow
def test_a_persistent_fault_reproduces_under_its_emulation_only(runs: dict[str, Path], capsys) -> None:
    bundle = runs["root"] / "INC-persistent"
    assert (
        main(["incident", "--golden", str(runs["golden"]), "--suspect", str(runs["persistent"]), "--out", str(bundle)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "incident at step 3, microbatch 0, forward layers.1.feed_forward" in printed
    manifest = json.loads((bundle / "manifest.json").read_text())
    site = manifest["site"]
    assert (site["step"], site["microbatch"], site["name"], site["phase"]) == SITE
    assert manifest["checkpoint"] == 2 and manifest["module"] == "FeedForward"
    # The captured golden output is the one the golden log fingerprinted; the suspect's is not.
    prints = manifest["fingerprints"]
    assert prints["golden"] == [prints["logged"]] and prints["suspect"] != prints["golden"]
    assert manifest["suspect"]["inputs_were_golden"] and manifest["suspect"]["output_from"] == "emulated"
    ops = [o["op"] for o in manifest["ops"]]
    assert ops.count("aten.mm.default") == 3 and "aten.silu.default" in ops
    mm = next(o for o in manifest["ops"] if o["op"] == "aten.mm.default")
    assert all({"shape", "stride", "dtype"} <= set(m) for m in mm["read_meta"].values()) and mm["results"]
    # Three fault events (one per matmul), each an exponent bit; the output's signature names its op and step.
    assert len(manifest["faults"]) == 3 and all(f["site"] == SITE[2] for f in manifest["faults"])
    (sig,) = manifest["signatures"]
    assert sig["step"] == 3 and sig["op"] == "aten.mm.default" and sig["differing"] > 0
    tensors = read_safetensors(bundle / "tensors.safetensors")
    assert {"input.0", "param.w1.weight", "rng.cpu", "golden.output.0", "suspect.output.0"} <= set(tensors)
    assert tensors["rng.cpu"].dtype == torch.uint8
    safetensors = pytest.importorskip("safetensors.torch")
    theirs = safetensors.load_file(str(bundle / "tensors.safetensors"))
    assert all(torch.equal(theirs[k], tensors[k]) for k in tensors)

    result = assert_persistent_under_emulation_only(bundle, runs["persistent.toml"], repeats=3)
    assert result["emulated"]["faults_per_run"] == [3, 3, 3]


@pytest.mark.slow
def test_a_transient_fault_classifies_transient(runs: dict[str, Path]) -> None:
    bundle = runs["root"] / "INC-transient"
    done = sdc(
        "incident",
        "--golden",
        str(runs["golden"]),
        "--suspect",
        str(runs["transient"]),
        "--out",
        str(bundle),
        "--at",
        ":".join(map(str, SITE)),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((bundle / "manifest.json").read_text())["signatures"]
    emulated = sdc(
        "incident", "reproduce", str(bundle), "--fault-profile", str(runs["transient.toml"]), "--repeats", "3"
    )
    assert emulated.returncode == VERDICTS["transient"], emulated.stdout + emulated.stderr
    assert "transient (exit 0)" in emulated.stdout and "3 reproduce the golden bits" in emulated.stdout
    assert reproduce_py(bundle).returncode == VERDICTS["transient"]


@pytest.mark.slow
def test_refusals_name_what_to_do(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    golden, suspect = str(runs["golden"]), str(runs["persistent"])
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["incident", "--golden", golden, "--suspect", suspect, "--out", str(foreign)]) == 1
    assert "notes.txt" in capsys.readouterr().err and (foreign / "notes.txt").exists()
    out = str(tmp_path / "INC")
    assert (
        main(
            [
                "incident",
                "--golden",
                golden,
                "--suspect",
                suspect,
                "--out",
                out,
                "--at",
                "3:0:layers.1.feed_forward:backward",
            ]
        )
        == 1
    )
    assert "forward sites only" in capsys.readouterr().err and not Path(out).exists()
    assert main(["incident", "--golden", golden, "--fault-profile", str(runs["persistent.toml"]), "--out", out]) == 1
    assert "pass --at" in capsys.readouterr().err
    assert main(["incident", "--golden", golden, "--suspect", suspect, "--out", out, "--at", "3:layers"]) == 1
    assert "STEP:MB:SITE:PHASE" in capsys.readouterr().err
