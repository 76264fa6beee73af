"""Every named query on a real study database, checked against numbers computed here from the logs.

The expected values come from the runs' own event logs and checkpoints (read with
`tracer.log` and `tracer.checkpoint`) and from what the fault profile injects, never from
the database the queries read.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from analysis import queries
from tests.analysis.conftest import Study
from tests.support import events
from tracer.checkpoint import list_checkpoints, load_checkpoint
from tracer.log import LogReader, Phase, TensorRecord, rank_dir

QUERY_DIR = Path(queries.__file__).parent


def rows(study: Study, name: str) -> list[dict]:
    return queries.run(study.db, name).records()


def only(study: Study, name: str, node: str) -> dict:
    (row,) = [r for r in rows(study, name) if r["node_label"] == node]
    return row


# -- independent computations ------------------------------------------------------------
def site_calls(study: Study) -> list[dict]:
    return [{"step": e.step, **e.fields} for e in events(study.lockstep, "site_mismatch")]


def mismatch_stats(calls: list[dict]) -> dict:
    elements = np.array([c["elements"] for c in calls], dtype=np.int64)
    mismatched = np.array([c["mismatched"] for c in calls], dtype=np.int64)
    severities = [c["severity"] for c in calls if c["mismatched"] > 0 and c["severity"] is not None]
    return {
        "calls": len(calls),
        "mismatching_calls": int((mismatched > 0).sum()),
        "elements": int(elements.sum()),
        "mismatched": int(mismatched.sum()),
        "frequency": mismatched.sum() / elements.sum(),
        "severity": float(np.mean(severities)) if severities else None,
        "max_rel": max(c["max_rel"] for c in calls),
    }


def assert_matches(row: dict, expected: dict) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert row[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert row[key] == value, key


def runs_of_consecutive(steps: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for s in sorted(steps):
        if out and out[-1][-1] == s - 1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def fault_units(run: Path) -> tuple[list[dict], dict[tuple, list[bool]]]:
    """The run's faults, and every ABFT-checked unit with its verdicts (flag = True)."""
    checks: dict[tuple, list[bool]] = defaultdict(list)
    for a in events(run, "abft"):
        f = a.fields
        checks[a.step, f["microbatch"], f["site"], f["phase"], f["op"]].append(f["verdict"] == "flag")
    faults = [{"step": e.step, **e.fields} for e in events(run, "fault")]
    for f in faults:
        f["unit"] = (f["step"], f["microbatch"], f["site"], f["phase"], f["op"])
    return faults, checks


def fingerprints(run: Path) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    for r in LogReader(rank_dir(run, 0)).records():
        if isinstance(r, TensorRecord):
            out.setdefault((r.step, r.microbatch, r.name, r.phase), r.fingerprint)
    return out


def records(run: Path) -> dict[tuple, int]:
    """Every tensor record's fingerprint by (step, microbatch, name, phase, occurrence in log order)."""
    out: dict[tuple, int] = {}
    seen: dict[tuple, int] = defaultdict(int)
    for r in LogReader(rank_dir(run, 0)).records():
        if isinstance(r, TensorRecord):
            key = (r.step, r.microbatch, r.name, r.phase)
            out[(*key, seen[key])] = r.fingerprint
            seen[key] += 1
    return out


def run_id(run: Path) -> str:
    return LogReader(rank_dir(run, 0)).header.run_id


def losses(run: Path) -> dict[int, float]:
    return {e.step: e.fields["loss"] for e in events(run, "step")}


def spikes(loss: dict[int, float]) -> dict[int, tuple[float, float | None]]:
    """The documented rule: not finite, or at least 5 of the previous 10 finite and above 1.5x their median."""
    out = {}
    for step, value in sorted(loss.items()):
        history = [loss[s] for s in range(step - 10, step) if s in loss and math.isfinite(loss[s])]
        baseline = statistics.median(history) if len(history) >= 5 else None
        if not math.isfinite(value) or (baseline is not None and value > 1.5 * baseline):
            out[step] = (value, baseline)
    return out


@functools.cache  # several tests ask; each call loads every checkpoint
def drift(golden: Path, suspect: Path) -> dict[int, float]:
    out = {}
    for step in sorted(set(list_checkpoints(golden)) & set(list_checkpoints(suspect))):
        g, s = load_checkpoint(golden, step).model, load_checkpoint(suspect, step).model
        diff = sum(float(((s[n].double() - g[n].double()) ** 2).sum()) for n in g if g[n].is_floating_point())
        norm = sum(float((g[n].double() ** 2).sum()) for n in g if g[n].is_floating_point())
        out[step] = math.sqrt(diff) / math.sqrt(norm)
    return out


def first_divergence(golden: Path, suspect: Path) -> tuple | None:
    """The earliest differing record in the documented execution order."""
    g, s = fingerprints(golden), fingerprints(suspect)
    order = {Phase.INPUT: 0, Phase.FORWARD: 1, Phase.BACKWARD: 2, Phase.GRAD: 3, Phase.PARAM: 4}
    position = {key: i for i, key in enumerate(g)}
    last = min(max(k[0] for k in g), max(k[0] for k in s))
    differing = [k for k in g if k[0] <= last and s.get(k) != g[k]]
    if not differing:
        return None
    step, mb, name, phase = min(
        differing, key=lambda k: (k[0], k[3] in (Phase.GRAD, Phase.PARAM), k[1], order[k[3]], position[k])
    )
    return step, mb, name, phase.name.lower()


# -- the folder and the listing --------------------------------------------------------
def test_every_sql_file_is_a_named_query_with_a_description() -> None:
    files = sorted(p.stem for p in QUERY_DIR.glob("*.sql"))
    assert queries.names() == files and "summary" in files
    for name in files:
        text = queries.sql(name)
        assert text.startswith("-- ") and queries.description(name) == text.splitlines()[0][3:].strip()
        assert name.startswith(("rq1_", "rq2_", "rq3_", "summary", "guard_")) or name in PLAIN_NAMES
        assert text.rstrip().splitlines()[-1].startswith("ORDER BY"), f"{name}: does not end in an ORDER BY"
        assert f"`{name}`" in (QUERY_DIR.parent / "QUERIES.md").read_text(encoding="utf-8"), f"QUERIES.md lacks {name}"


# No loss spikes, no fine-tunes, no guarded recording and no sharpness here; tests/pipelines/test_finetune_diff.py
# checks the fine-tune queries, tests/pipelines/test_detector_alarms.py guard_outcome, test_drift_rate.py rq3_sharpness.
NOT_IN_THIS_STUDY = {
    "rq3_loss_spikes",
    "rq3_finetune_accuracy",
    "rq3_finetune_disagreement",
    "rq3_finetune_plateau",
    "guard_outcome",
    "rq3_sharpness",
    "signature_groups",
}
# Queries named for what they answer, not for a research question; signature_groups groups incidents across nodes (its
# rows name them in node_labels: tests/replay/test_incident_fleet.py)
PLAIN_NAMES = {"last_clean_checkpoint", "signature_groups"}


@pytest.mark.slow
def test_every_named_query_runs_and_is_deterministic(study: Study) -> None:
    for name in queries.names():
        first, again = queries.run(study.db, name), queries.run(study.db, name)
        assert first == again and first.columns, name
        assert {"node_label", "suspect_node", "node_labels"} & set(first.columns), name
        if name not in NOT_IN_THIS_STUDY:
            assert first.rows, f"{name}: no rows on a study with lockstep, param-sync, faults and ABFT"


@pytest.mark.slow
def test_summary_totals_are_what_sdc_diff_prints(study: Study) -> None:
    for node, suspect in (("node-7", study.node7), ("node-3", study.node3)):
        g, s = records(study.golden), records(suspect)
        last = min(max(k[0] for k in g), max(k[0] for k in s))
        compared = {k for k in g.keys() | s.keys() if k[0] <= last}
        assert_matches(
            only(study, "summary_totals", node),
            {
                "golden_node": "golden",
                "golden_run_id": run_id(study.golden),
                "suspect_run_id": run_id(suspect),
                "events_compared": len(compared),
                "events_differing": sum(g.get(k) != s.get(k) for k in compared),
                "compared_through": last,
                "max_drift": max(drift(study.golden, suspect).values()),
                "loss_spikes": len(spikes(losses(study.golden))) + len(spikes(losses(suspect))),
            },
        )


@pytest.mark.slow
# -- RQ1 --------------------------------------------------------------------------------
def test_mismatch_by_node_site_step_and_calls(study: Study) -> None:
    calls = site_calls(study)
    assert_matches(only(study, "rq1_mismatch_by_node", "node-7"), mismatch_stats(calls))
    assert {r["node_label"] for r in rows(study, "rq1_mismatch_by_node")} == {"node-7"}  # node-3 had no lockstep

    by_site = rows(study, "rq1_mismatch_by_site")
    groups = defaultdict(list)
    for c in calls:
        groups[c["site"], c["phase"]].append(c)
    assert [(r["site"], r["phase"]) for r in by_site] == sorted(groups)
    for r in by_site:
        assert_matches(r, mismatch_stats(groups[r["site"], r["phase"]]))

    by_step = rows(study, "rq1_mismatch_by_step")
    assert [r["step"] for r in by_step] == list(range(6))
    for r in by_step:
        assert_matches(r, mismatch_stats([c for c in calls if c["step"] == r["step"]]))

    differing = rows(study, "rq1_mismatch_calls")
    expected = sorted(
        (c["step"], c["microbatch"], c["site"], c["phase"], c["severity"]) for c in calls if c["mismatched"]
    )
    assert [(r["step"], r["microbatch"], r["site"], r["phase"], r["severity"]) for r in differing] == expected


@pytest.mark.slow
def test_mismatch_bursts(study: Study) -> None:
    calls = site_calls(study)
    mismatching = sorted({c["step"] for c in calls if c["mismatched"] > 0})
    assert mismatching == [1, 2, 4, 5]  # the profile's armed steps: 1-2, 4 and 5
    bursts = runs_of_consecutive(mismatching)
    longest = max(bursts, key=len)
    assert_matches(
        only(study, "rq1_mismatch_bursts", "node-7"),
        {
            "steps_replayed": 6,
            "first_step": 0,
            "last_step": 5,
            "steps_mismatching": len(mismatching),
            "step_fraction": len(mismatching) / 6,
            "bursts": len(bursts),
            "longest_burst": len(longest),
            "longest_burst_start": longest[0],
            "mean_burst": float(np.mean([len(b) for b in bursts])),
        },
    )


@pytest.mark.slow
def test_abft_detection_rate_by_fault_kind(study: Study) -> None:
    faults, checks = fault_units(study.node7)
    golden, suspect = fingerprints(study.golden), fingerprints(study.node7)
    sites = {k[2] for k in golden if k[3] in (Phase.FORWARD, Phase.BACKWARD)}
    found = {(r["side"], r["kind"]): r for r in rows(study, "rq1_abft_by_fault_kind")}
    assert set(found) == {("suspect", "scale"), ("suspect", "bitflip")}
    for kind in ("scale", "bitflip"):
        mine = [f for f in faults if f["kind"] == kind]
        checked = [f for f in mine if f["unit"] in checks]
        flagged = [f for f in checked if any(checks[f["unit"]])]
        compared = []
        for f in mine:
            traced = max((s for s in sites if f["site"] == s or f["site"].startswith(s + ".")), key=len, default=None)
            if traced is not None:
                key = (f["step"], f["microbatch"], traced, Phase[f["phase"].upper()])
                compared.append(golden[key] != suspect[key])
        assert_matches(
            found["suspect", kind],
            {
                "node_label": "node-7",
                "faults": len(mine),
                "abft_checked": len(checked),
                "abft_flagged": len(flagged),
                "abft_rate": len(flagged) / len(checked),
                "fingerprint_compared": len(compared),
                "fingerprint_detected": sum(compared),
                "fingerprint_rate": sum(compared) / len(compared),
            },
        )
    assert found["suspect", "scale"]["abft_rate"] > 0  # a 100x element is far outside the rounding bound
    assert found["suspect", "bitflip"]["abft_flagged"] == 0  # a last-bit flip is within it
    assert found["suspect", "bitflip"]["fingerprint_rate"] == 1.0  # fingerprints see every bit


@pytest.mark.slow
def test_detection_scores_of_abft(study: Study) -> None:
    faults, checks = fault_units(study.node7)
    faulted = {f["unit"] for f in faults}
    flagged = {u for u, verdicts in checks.items() if any(verdicts)}
    tp, fp = len(flagged & faulted), len(flagged - faulted)
    fn = len((set(checks) - flagged) & faulted)
    row = next(r for r in rows(study, "rq1_detection_scores") if r["detector"] == "abft")
    assert_matches(
        row,
        {
            "node_label": "node-7",
            "side": "suspect",
            "units": len(checks),
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "tn": len(checks) - tp - fp - fn,
            "recall": tp / (tp + fn),
            "precision": tp / (tp + fp),
        },
    )
    for r in rows(study, "rq1_detection_scores"):
        if r["tp"] + r["fn"]:
            assert r["recall"] == r["tp"] / (r["tp"] + r["fn"])
        else:
            assert r["recall"] is None  # node-3: nothing injected, nothing to recall


@pytest.mark.slow
# -- RQ2 --------------------------------------------------------------------------------
def test_noise_to_signal_per_step_and_worst_case(study: Study) -> None:
    noise = events(study.param_sync, "grad_noise")
    total = {e.step: e.fields for e in noise if e.fields["name"] == "*"}
    by_step = rows(study, "rq2_noise_by_step")
    assert [r["step"] for r in by_step] == [3, 4, 5]
    for r in by_step:
        for key in ("diff_l2", "golden_l2", "ratio"):
            assert r[key] == total[r["step"]][key], key
    assert total[3]["ratio"] == 0.0  # nothing is injected at step 3
    ratios = np.array([total[s]["ratio"] for s in (3, 4, 5)])
    worst_step = int(max(total, key=lambda s: total[s]["ratio"]))
    assert worst_step == 5  # the blown-up LM head
    per_param = {e.fields["name"]: e.fields["ratio"] for e in noise if e.step == worst_step and e.fields["name"] != "*"}
    worst_param = max(sorted(per_param), key=per_param.__getitem__)
    assert_matches(
        only(study, "rq2_noise_worst", "node-7"),
        {
            "steps": 3,
            "noisy_steps": int((ratios > 0).sum()),
            "mean_ratio": float(ratios.mean()),
            "median_ratio": float(np.median(ratios)),
            "worst_ratio": float(ratios.max()),
            "worst_step": worst_step,
            "worst_parameter": worst_param,
            "worst_parameter_ratio": per_param[worst_param],
        },
    )


@pytest.mark.slow
# -- RQ3 --------------------------------------------------------------------------------
def test_drift_beside_both_loss_curves(study: Study) -> None:
    for node, suspect, checkpoints in (("node-7", study.node7, [0, 2, 4, 6]), ("node-3", study.node3, [0, 2])):
        g, s = losses(study.golden), losses(suspect)
        d = drift(study.golden, suspect)
        spiked = spikes(s)
        found = [r for r in rows(study, "rq3_drift_and_loss") if r["node_label"] == node]
        assert [r["step"] for r in found] == sorted(set(g) | set(d))
        for r in found:
            step = r["step"]
            assert r["golden_loss"] == g.get(step) and r["suspect_loss"] == s.get(step)
            if step in s:
                assert r["loss_diff"] == pytest.approx(s[step] - g[step], abs=1e-12)
            assert (r["drift"] is None) == (step not in d)
            if step in d:
                assert r["drift"] == pytest.approx(d[step], rel=1e-9, abs=1e-15)
            assert r["suspect_spike"] == (step in spiked) and r["golden_spike"] == (step in spikes(g))
        assert sorted(d) == checkpoints and d[0] == 0.0
        assert (node == "node-3") == all(v == 0.0 for v in d.values())


@pytest.mark.slow
def test_loss_spikes(study: Study) -> None:
    g, s = losses(study.golden), losses(study.node7)
    expected = spikes(s)
    assert list(expected) == [5] and not spikes(g)  # the LM head blown up at step 5, nothing on golden
    found = rows(study, "rq3_loss_spikes")
    assert [(r["node_label"], r["side"], r["step"]) for r in found] == [("node-7", "suspect", 5)]
    ((value, baseline),) = expected.values()
    assert_matches(
        found[0],
        {"loss": value, "baseline": baseline, "ratio": value / baseline, "golden_loss": g[5], "suspect_loss": s[5]},
    )


@pytest.mark.slow
def test_first_divergence(study: Study) -> None:
    found = {r["node_label"]: r for r in rows(study, "rq3_first_divergence")}
    step, mb, name, phase = first_divergence(study.golden, study.node7)
    assert (step, name, phase) == (1, "layers.1.feed_forward", "forward")  # the first armed fault
    r = found["node-7"]
    assert (r["step"], r["microbatch"], r["name"], r["phase"], r["status"]) == (step, mb, name, phase, "differ")
    assert r["golden_node"] == "golden" and r["compared_through"] == 5
    assert first_divergence(study.golden, study.node3) is None
    assert found["node-3"]["compared_through"] == 2 and found["node-3"]["step"] is None


@pytest.mark.slow
def test_summary_has_the_headline_numbers(study: Study) -> None:
    summary = {r["node_label"]: r for r in rows(study, "summary")}
    assert list(summary) == ["node-3", "node-7"]
    calls = site_calls(study)
    stats = mismatch_stats(calls)
    faults, checks = fault_units(study.node7)
    checked = [f for f in faults if f["unit"] in checks]
    noise = [e.fields["ratio"] for e in events(study.param_sync, "grad_noise") if e.fields["name"] == "*"]
    d = drift(study.golden, study.node7)
    step, _, name, phase = first_divergence(study.golden, study.node7)
    assert_matches(
        summary["node-7"],
        {
            "golden_node": "golden",
            "compared_through": 5,
            "first_step": step,
            "first_site": f"{name} {phase}",
            "mismatch_frequency": stats["frequency"],
            "mismatch_severity": stats["severity"],
            "mismatching_steps": 4,
            "lockstep_steps": 6,
            "worst_noise": max(noise),
            "suspect_spikes": 1,
            "faults": len(faults),
            "abft_rate": sum(any(checks[f["unit"]]) for f in checked) / len(checked),
        },
    )
    assert summary["node-7"]["final_drift"] == pytest.approx(d[max(d)], rel=1e-9)
    assert summary["node-7"]["max_drift"] == pytest.approx(max(d.values()), rel=1e-9)
    assert_matches(
        summary["node-3"],
        {
            "compared_through": 2,
            "first_step": None,
            "mismatch_frequency": None,
            "worst_noise": None,
            "final_drift": 0.0,
            "suspect_spikes": 0,
            "faults": 0,
            "abft_rate": None,
        },
    )
