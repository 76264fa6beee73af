"""HF Trainer and Lightning runs through the whole tool: record, diff, replay (each test runs for both).

What the sites can show today: HF decoder layers call their MLP positionally, so ``model.layers.N.mlp`` gets
forward and backward records; attention (called with keywords) is left out until keyword-argument sites get
backward records.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from sdc.cli import main
from tests.integrations.conftest import Recorded
from tests.support import captured_gradients, diff_first_divergence, events
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.pairing import check_pair
from tracer.summary import summarize_run

pytestmark = pytest.mark.slow  # records real runs or starts processes: seconds each


def header(run: Path):
    return LogReader(rank_dir(run, 0)).header


def replay(r: Recorded, mode: str, steps: str, out: Path) -> Path:
    """`sdc replay` with the sick node's fault profile, rebuilding the run through the framework's factory."""
    code = main(
        [
            "replay",
            "--golden",
            str(r.golden),
            "--fault-profile",
            str(r.profile),
            "--workload",
            r.framework.WORKLOAD,
            "--mode",
            mode,
            "--steps",
            steps,
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    return out


def test_two_healthy_runs_are_identical_by_fingerprint(recorded: Recorded) -> None:
    fw = recorded.framework
    result = compare_runs(recorded.golden, recorded.twin)
    assert result.first is None and result.steps == fw.STEPS and result.events > 0
    check_pair(header(recorded.golden), header(recorded.twin), "golden", "twin")
    sites = header(recorded.golden).extra["sites"]
    assert len(sites) == fw.SITE_COUNT and fw.FAULT_SITE in sites
    assert fw.SITES is None or all(re.fullmatch(fw.SITES, s) for s in sites)
    # Every site gives a backward record for each forward one, keyword-called HF attention included.
    (summary,) = summarize_run(recorded.golden)
    assert summary.tensors["forward"] == summary.tensors["backward"] > 0
    assert "sites_without_backward" not in summary.header.extra


def test_sdc_diff_finds_the_emulated_fault_as_the_first_divergence(recorded: Recorded, tmp_path: Path) -> None:
    fw = recorded.framework
    faults = events(recorded.sick, "fault")
    assert faults and {(f.step, f.fields["microbatch"], f.fields["site"], f.fields["phase"]) for f in faults} == {
        (fw.FAULT_STEP, 0, fw.FAULT_SITE, "forward")
    }
    first = diff_first_divergence(recorded.golden, recorded.sick, tmp_path / "study.duckdb")
    assert first == [(fw.FAULT_STEP, 0, "forward", fw.FAULT_SITE, "differ")]


def test_lockstep_replay_isolates_the_faulty_site(recorded: Recorded, tmp_path: Path) -> None:
    fw = recorded.framework
    k = fw.FAULT_STEP
    # Two steps: the faulty one, and the first of the next epoch (the factory's data loader walks on).
    out = replay(recorded, "lockstep", f"{k}:{k + 2}", tmp_path / "lock")
    sites = events(out, "site_mismatch")
    assert {(e.step, e.fields["microbatch"]) for e in sites} == {(k, 0), (k + 1, 0), (k + 1, 1)}
    assert len(sites) == 3 * fw.SITE_COUNT * 2  # (step, microbatch) x sites x phases
    hit = {(e.step, e.fields["site"], e.fields["phase"]) for e in sites if e.fields["mismatched"]}
    # The faulty site only: downstream sites computed on its golden output. Its own backward may differ too
    # (it reuses its corrupted activations); nothing else may.
    assert (k, fw.FAULT_SITE, "forward") in hit
    assert hit <= {(k, fw.FAULT_SITE, "forward"), (k, fw.FAULT_SITE, "backward")}
    assert [e.step for e in events(out, "fault")] and {e.step for e in events(out, "fault")} == {k}


def test_param_sync_noise_equals_the_recorded_gradients(recorded: Recorded, tmp_path: Path) -> None:
    k = recorded.framework.FAULT_STEP
    out = replay(recorded, "param-sync", f"{k}:{k + 1}", tmp_path / "sync")
    total = next(e for e in events(out, "grad_noise") if e.fields["name"] == "*")
    # The sick run was golden until step k, so its recorded step-k gradients are the golden parameters'
    # gradients on the faulty node: exactly what parameter sync computes, taken here from full tensors.
    golden, sick = captured_gradients(recorded.golden, k), captured_gradients(recorded.sick, k)
    assert set(golden) == set(sick) and golden
    diff = np.sqrt(sum(np.sum((sick[n] - golden[n]) ** 2) for n in golden))
    norm = np.sqrt(sum(np.sum(golden[n] ** 2) for n in golden))
    assert diff > 0 and total.fields["ratio"] == pytest.approx(diff / norm, rel=1e-6)
