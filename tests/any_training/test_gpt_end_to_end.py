"""A user's own GPT-2-style model and loop (`tests.any_training.gpt`), end to end through the command line:
record with ``--workload``, diff, and replay in both modes, against a fault at one known
(step, microbatch, site, phase) and gradients taken independently from full tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from sdc.cli import main
from tests.support import captured_gradients, diff_first_divergence, events
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.summary import summarize_run

pytestmark = pytest.mark.slow

WORKLOAD = "tests.any_training.gpt:build"
STEP, MICROBATCH, SITE = 2, 1, "h.1.attn"
CONFIG = """
[model]
layers = 2
microbatches = 2
[run]
steps = 4
checkpoint_every = 2
"""
# A custom profile, not a shipped one: `sdc replay --suspect` must re-create it from the run header.
PROFILE = rf"""
description = "a few elements of {SITE}'s forward matmuls scaled by 8 at step {STEP}, microbatch {MICROBATCH}"
seed = 7
[[fault]]
ops = ["matmul"]
sites = "h\\.1\\.attn"
phases = ["forward"]
steps = [{STEP}]
microbatches = [{MICROBATCH}]
elements = 4
kind = "scale"
factor = 8.0
"""


@dataclass(frozen=True)
class Runs:
    root: Path
    golden: Path
    twin: Path
    sick: Path


def record(root: Path, name: str, *extra: str) -> Path:
    out = root / name
    assert (
        main(
            [
                "record",
                "--workload",
                WORKLOAD,
                "--config",
                str(root / "gpt.toml"),
                "--out",
                str(out),
                "--node-label",
                name,
                "--quiet",
                *extra,
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("gpt")
    (root / "gpt.toml").write_text(CONFIG, encoding="utf-8")
    (root / "fault.toml").write_text(PROFILE, encoding="utf-8")
    capture = ["--capture-steps", str(STEP)]
    return Runs(
        root,
        golden=record(root, "golden", *capture),
        twin=record(root, "twin"),
        sick=record(root, "sick", *capture, "--fault-profile", str(root / "fault.toml")),
    )


def test_healthy_runs_are_identical_and_every_site_has_its_backward(runs: Runs) -> None:
    result = compare_runs(runs.golden, runs.twin)
    assert result.first is None and result.steps == 4
    (summary,) = summarize_run(runs.golden)
    assert summary.sites == ["h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp"]
    assert summary.tensors["forward"] == summary.tensors["backward"] == 4 * 2 * 4  # steps x microbatches x sites
    assert summary.header.extra["workload"] == WORKLOAD


def test_the_fault_is_the_first_divergence_in_sdc_diff(runs: Runs) -> None:
    faults = events(runs.sick, "fault")
    assert faults and {(f.step, f.fields["microbatch"], f.fields["site"], f.fields["phase"]) for f in faults} == {
        (STEP, MICROBATCH, SITE, "forward")
    }
    first = diff_first_divergence(runs.golden, runs.sick, runs.root / "study.duckdb")
    assert first == [(STEP, MICROBATCH, "forward", SITE, "differ")]


def replay(runs: Runs, mode: str, out: str) -> Path:
    # --suspect: the custom profile comes back from the sick run's header, not from a file.
    assert (
        main(
            [
                "replay",
                "--golden",
                str(runs.golden),
                "--suspect",
                str(runs.sick),
                "--workload",
                WORKLOAD,
                "--mode",
                mode,
                "--steps",
                f"{STEP}:{STEP + 1}",
                "--out",
                str(runs.root / out),
                "--quiet",
            ]
        )
        == 0
    )
    return runs.root / out


def test_lockstep_reports_a_mismatch_at_the_faulty_site_only(runs: Runs) -> None:
    sites = events(replay(runs, "lockstep", "lock"), "site_mismatch")
    assert len(sites) == 2 * 4 * 2  # microbatches x sites x phases
    hit = {(e.fields["microbatch"], e.fields["site"], e.fields["phase"]) for e in sites if e.fields["mismatched"]}
    # Downstream sites computed on the golden output; the faulty site's own backward reuses its corrupted
    # activations, so it may differ too. Nothing else may.
    assert (MICROBATCH, SITE, "forward") in hit
    assert hit <= {(MICROBATCH, SITE, "forward"), (MICROBATCH, SITE, "backward")}


def test_param_sync_noise_equals_one_from_full_gradient_tensors(runs: Runs) -> None:
    out = replay(runs, "param-sync", "sync")
    assert LogReader(rank_dir(out, 0)).header.extra["replay"]["workload"] == WORKLOAD
    total = next(e for e in events(out, "grad_noise") if e.fields["name"] == "*")
    # Until the fault the sick run is the golden one, so its recorded step gradients are the golden
    # parameters' gradients on the faulty node: what parameter sync recomputes.
    golden, sick = captured_gradients(runs.golden, STEP), captured_gradients(runs.sick, STEP)
    assert set(golden) == set(sick) and len(golden) > 10
    diff = np.sqrt(sum(np.sum((sick[n] - golden[n]) ** 2) for n in golden))
    norm = np.sqrt(sum(np.sum(golden[n] ** 2) for n in golden))
    assert diff > 0 and total.fields["ratio"] == pytest.approx(diff / norm, rel=1e-6)


def test_replay_imports_only_the_workload_you_name(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "replay",
            "--golden",
            str(runs.golden),
            "--fault-profile",
            "healthy-node",
            "--steps",
            "2:3",
            "--out",
            str(runs.root / "unnamed"),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and f"pass --workload {WORKLOAD}" in err
    assert not (runs.root / "unnamed").exists()
