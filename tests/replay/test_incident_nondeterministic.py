"""`sdc incident` on a site that is nondeterministic by design (tests/replay/unordered_sum.py: a sum in an order
drawn from a generator the model seeds from the clock): two healthy runs of it diverge there, the bundle's
reproduce.py, in a fresh process, classifies *nondeterministic*, and the audit of the same two runs
(`sdc verify-determinism --report`) lists the site with its ulps and band. Beside it, the same model with its generator
seeded alike on every call: the bundle restores the generator's captured state, so an emulated stuck bit
reproduces *persistent here* under its emulation and *transient* without it, never *nondeterministic*."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import load_profile
from jobs.record import record_run
from replay.bundle_reproduce import VERDICTS
from sdc.cli import main
from tests.replay import unordered_sum
from tests.replay.incident_support import assert_persistent_under_emulation_only, reproduce_py, sdc, stuck_bit
from tracer.options import CapturePolicy, TraceOptions

RUN = {"steps": 2, "checkpoint_every": 1}


def record(out: Path, seeded: bool | list[bool], **options) -> Path:
    """Every tensor of every step kept in the blob store: what the audit measures ulps on."""
    record_run(
        {"model": {"seeded": seeded}, "run": RUN},
        out,
        node_label=out.name,
        workload=unordered_sum.WORKLOAD,
        trace=TraceOptions(sites=unordered_sum.SITES, capture=CapturePolicy(every=1)),
        progress=False,
        **options,
    )
    return out


@pytest.mark.slow
def test_a_site_that_sums_in_a_random_order_classifies_nondeterministic(tmp_path: Path, capsys) -> None:
    golden, twin = record(tmp_path / "golden", False), record(tmp_path / "twin", False)
    bundle = tmp_path / "INC"
    done = sdc(
        "incident",
        "--golden",
        str(golden),
        "--suspect",
        str(twin),
        "--out",
        str(bundle),
        "--workload",
        unordered_sum.WORKLOAD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forward layers.0.mix" in done.stdout and "seeds anew on each run" in done.stdout
    assert "other bits at this site than golden's log" in done.stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["generators"] == {"draws": 1, "drawn_afresh": 1}
    assert manifest["golden_reexecution_matched_log"] is False
    assert manifest["golden_reexecution_differed_after"] == ""  # what differs after the site follows from it
    plain = reproduce_py(bundle, repeats=5)
    assert plain.returncode == VERDICTS["nondeterministic"], plain.stdout + plain.stderr
    result = json.loads(plain.stdout)
    assert result["verdict"] == "nondeterministic" and result["runs_differing_from_the_first"][0] >= 1

    tolerance = tmp_path / "tolerance.json"
    assert main(["verify-determinism", "--report", str(tolerance), str(golden), str(twin)]) == 1
    assert "layers.0.mix" in capsys.readouterr().out
    places = {(p["name"], p["phase"]): p for p in json.loads(tolerance.read_text())["places"]}
    mix = places["layers.0.mix", "forward"]
    assert mix["events"] == RUN["steps"] and mix["max_ulps"] >= 1 and mix["band"] > 0


@pytest.mark.slow
def test_a_generator_seeded_alike_on_every_run_is_restored_not_drawn_anew(tmp_path: Path) -> None:
    profile = tmp_path / "proj.toml"
    profile.write_text(stuck_bit("layers.0.mix.proj", step=1, bit=27), encoding="utf-8")
    golden = record(tmp_path / "golden", True)
    sick = record(tmp_path / "sick", True, fault_profile=load_profile(profile))
    bundle = tmp_path / "INC"
    done = sdc(
        "incident",
        "--golden",
        str(golden),
        "--suspect",
        str(sick),
        "--out",
        str(bundle),
        "--workload",
        unordered_sum.WORKLOAD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "seeds anew" not in done.stdout and "other bits at this site" not in done.stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert (manifest["site"]["step"], manifest["site"]["name"]) == (1, "layers.0.mix")
    assert manifest["generators"] == {"draws": 1, "drawn_afresh": 0} and manifest["golden_reexecution_matched_log"]
    assert manifest["golden_reexecution_differed_after"] == ""
    assert_persistent_under_emulation_only(bundle, profile, repeats=2)


@pytest.mark.slow
def test_a_site_after_the_incident_that_differs_on_re_execution_is_named_not_refused(tmp_path: Path) -> None:
    # layers.0.mix seeds its generator alike on every run, layers.1.mix from the clock: re-executing golden here
    # matches its log at the incident's site (layers.0.mix, step 1) and differs after it, at layers.1.mix. The
    # bundle holds nothing computed after the site, so the capture goes on and says so; a difference before the site
    # would still refuse it.
    profile = tmp_path / "proj.toml"
    profile.write_text(stuck_bit("layers.0.mix.proj", step=1, bit=27), encoding="utf-8")
    golden = record(tmp_path / "golden", [True, False])
    bundle = tmp_path / "INC"
    done = sdc(
        "incident",
        "--golden",
        str(golden),
        "--fault-profile",
        str(profile),
        "--at",
        "1:0:layers.0.mix:forward",
        "--out",
        str(bundle),
        "--workload",
        unordered_sum.WORKLOAD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "differed from its log after this site, first at step 1, microbatch 0, forward layers.1.mix" in done.stdout
    assert "other bits at this site" not in done.stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["golden_reexecution_matched_log"] is True
    assert manifest["golden_reexecution_differed_after"].startswith("step 1, microbatch 0, forward layers.1.mix")
    assert_persistent_under_emulation_only(bundle, profile, repeats=2)
