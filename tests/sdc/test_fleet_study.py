"""The fleet study: fleet-mini end to end, its qualitative findings, and each reproduction query against the logs."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from analysis.queries import LIBRARY
from analysis.reproduction import FINDINGS, build_reproduction
from analysis.reproduction_rules import learnt_tasks
from faults import load_profile
from faults.fleet import FleetSpec
from faults.fleet_files import drawn
from faults.fleet_hardware import hardware_fleet
from sdc.cli import main
from sdc.study.fleet_study import FleetPaths, load_fleet_study, run_fleet_study
from sdc.study.runner import StudyPaths
from tests.support import events
from tools.sweep_seeds import RQ1, sweep, table
from tracer.errors import ConfigError
from tracer.log import LogReader, rank_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> FleetPaths:
    out = tmp_path_factory.mktemp("fleet-mini") / "study"
    result = run_fleet_study(load_fleet_study("fleet-mini"), out, progress=False)
    return result.paths


def _records(paths: FleetPaths, part: str, query: str) -> list[dict[str, Any]]:
    return LIBRARY.run(paths.part(part).db, query).records()


def _profile(run: Path) -> str | None:
    recorded = LogReader(rank_dir(run, 0)).header.extra.get("fault_profile")
    return recorded["name"] if recorded else None


def _unhealthy(part: StudyPaths) -> list[str]:
    """Labels of the part's nodes emulated with a profile other than healthy-node, from the run headers."""
    return sorted(p.name for p in (part.out / "runs").iterdir() if _profile(p) not in (None, "healthy-node"))


def test_fleet_mini_writes_the_reproduction_table_with_every_finding(fleet: FleetPaths) -> None:
    text = fleet.reproduction.read_text(encoding="utf-8")
    for finding in FINDINGS:
        assert finding.study in text and f"`{finding.query}`" in text
    # the provenance column, from the profiles the runs recorded: the generator builds bursts and the tail in
    assert re.search(r"\| built in: [1-5] of 5 nodes' rules follow a burst chain", text) and "| emergent: " in text
    assert "Provenance: " in text
    assert "the query failed" not in text and "no rq" not in text
    # both kinds of row, named: recovery rows with measured beside injected numbers, finding rows with a verdict
    assert "**RECOVERY rows (1-7, 15) restate the fault model**" in text and "**FINDING rows (8-14)" in text
    assert text.count("; recovery error: ") >= 13  # rows 1-7 of the study model, 1-6 of the hardware model
    assert re.search(r"\*\*(consistent|not consistent)\*\*", text) and "Totals, study: recovery rows: " in text
    page = (fleet.report / "index.html").read_text(encoding="utf-8")
    assert 'id="reproduction"' in page and "../rq1/report/index.html" in page
    assert sorted(p.name for p in fleet.profiles.glob("node-*.toml")) == [f"node-0{i}.toml" for i in range(1, 6)]


def test_fleet_mini_shows_the_qualitative_findings_its_size_allows(fleet: FleetPaths) -> None:
    nodes = {r["node_label"]: r for r in _records(fleet, "rq1", "rq1_fleet_nodes")}
    assert set(nodes) == set(_unhealthy(fleet.part("rq1"))) and len(nodes) == 5
    assert any(r["mismatching_calls"] == 0 for r in nodes.values()), "a silent node"
    assert any(r["fano"] is not None and r["fano"] > 1 for r in nodes.values()), "a bursty node"
    assert any(r["max_rel"] >= 100 for r in nodes.values()), "a heavy-tail node"
    assert sum(r["faults_outside_matmul"] for r in nodes.values()) > 0, "ABFT misses faults outside matmul"
    assert sum(r["faults_below_bound"] for r in nodes.values()) > 0, "ABFT misses faults below its bound"
    twin = LIBRARY.run(fleet.part("rq1").db, "rq1_mismatch_by_node").records()
    assert all(r["mismatched"] == 0 for r in twin if r["node_label"] == "node-00"), "the healthy twin shows zero"


def test_fleet_mini_controls_neither_spike_nor_burst(fleet: FleetPaths) -> None:
    # The healthy twin node-00 and golden's shuffle-seed twin inject nothing, in any experiment ...
    for part in ("rq1", "rq2", "rq3"):
        assert not events(fleet.part(part).run("node-00"), "fault"), part
    assert not events(fleet.part("rq3").run("golden-twin"), "fault")
    assert not events(fleet.part("rq3").finetune("node-00"), "fault")
    # ... so nothing of theirs may burst or count as a spike: the rules see no fault of theirs ...
    rules = {r["node_label"]: r for r in _records(fleet, "rq1", "rq1_fleet_profiles")}
    assert rules["node-00"]["profile"] == "healthy-node" and rules["node-00"]["p_call"] == 0
    assert "node-00" not in {r["node_label"] for r in _records(fleet, "rq1", "rq1_fleet_nodes")}
    spikes = _records(fleet, "rq3", "rq3_loss_spikes")
    controls = [r for r in spikes if r["side"] == "suspect" and r["kind"] in ("healthy", "baseline")]
    assert all(r["faults_before"] == 0 for r in controls)
    # ... and the healthy twin, a bit-identical replay of golden, has no spike golden lacks
    assert not [r for r in controls if r["node_label"] == "node-00" and not r["golden_spike"]]
    text = fleet.reproduction.read_text(encoding="utf-8")
    assert "the null, healthy twins diffed against golden:" in text
    # every fine-tune twin is diffed against golden as a baseline pair: the spikes' null
    twins = LIBRARY.run(
        fleet.part("rq3").db, "SELECT suspect_node, role FROM pair_nodes WHERE baseline ORDER BY 1, 2"
    ).rows
    assert [tuple(t) for t in twins] == [
        ("golden-twin", "finetune"),
        ("golden-twin", "train"),
        ("golden-twin-2", "finetune"),
        ("golden-twin-3", "finetune"),
    ]


def test_fleet_mini_runs_both_fault_models_on_shared_golden_runs(fleet: FleetPaths) -> None:
    hardware = fleet.part("hardware/rq1")
    # the hardware model's nodes are recorded, replayed and diffed in their own experiment folder ...
    assert sorted(p.name for p in (hardware.out / "runs").iterdir()) == [f"node-0{i}" for i in range(1, 6)]
    assert hardware.run("golden") == fleet.part("rq1").run("golden")  # ... against the one golden recording
    nodes = {r["node_label"]: r for r in _records(fleet, "hardware/rq1", "rq1_fleet_nodes")}
    assert sorted(nodes) == [f"node-0{i}" for i in range(1, 6)]
    profiles = {r["profile"] for r in _records(fleet, "hardware/rq1", "rq1_fleet_profiles")}
    assert profiles == {load_profile(p).name for p in sorted((fleet.profiles / "hardware").glob("node-*.toml"))}
    golden = [LogReader(rank_dir(fleet.part("rq1").run("golden"), 0)).header.run_id]
    pairs = LIBRARY.run(hardware.db, "SELECT DISTINCT golden_run_id FROM pairs").rows
    assert [p[0] for p in pairs] == golden
    assert not (fleet.out / "hardware" / "rq2").exists() and not (fleet.out / "hardware" / "rq3").exists()
    # the table shows every row for both models; rows of experiments a model did not run say so
    text = fleet.reproduction.read_text(encoding="utf-8")
    assert "| # | kind | level | the study | study | hardware |" in text
    assert "## The study fault model" in text and "## The hardware fault model" in text
    hw = text[text.index("## The hardware fault model") : text.index("## Rules")]
    assert hw.count("not run for this model (rq2") == 1 and hw.count("not run for this model (rq3") == 8
    assert 'id="reproduction-hardware"' in (fleet.report / "index.html").read_text(encoding="utf-8")


def test_the_seed_sweep_gives_the_study_s_rq1_verdicts_and_judges_each_seed_s_own_fleet(
    fleet: FleetPaths, tmp_path: Path
) -> None:
    """tools/sweep_seeds.py at fleet-mini's own seed gives the RQ1 verdicts the whole study gave (golden recorded once,
    no healthy twin, no report: nothing the RQ1 rows read changes), and at another seed judges that seed's drawn fleet
    with the study's rules; "k of n seeds" counts the seeds whose rule holds. The study model alone (the first model,
    whose part drops the healthy twin) keeps it short."""
    mini = load_fleet_study("fleet-mini")
    shipped = mini.fleets[0].seed
    swept = sweep(mini, (shipped, shipped + 1), tmp_path, ("study",))
    study = build_reproduction({"rq1": fleet.part("rq1").db, "rq2": None, "rq3": None})
    other = tmp_path / f"seed-{shipped + 1:03d}"
    rows = LIBRARY.run(StudyPaths(other / "study").db, "rq1_fleet_nodes").records()
    spec = FleetSpec(nodes=5, seed=shipped + 1)
    for node in drawn(spec):  # the generator's own files at that seed
        assert (other / "profiles" / f"{node.label}.toml").read_text(encoding="utf-8") == node.text
    assert {r["node_label"] for r in rows} == {n.label for n in drawn(spec)}
    assert (tmp_path / "sweep.log").read_text(encoding="utf-8").count("== record golden") == 1  # once for both seeds
    text = table(swept)
    for i in RQ1:
        assert swept.result("study", shipped).rep.rows[i].verdict == study.rows[i].verdict, i + 1
        outcomes = swept.outcomes("study", i)
        assert outcomes[1] == FINDINGS[i].judge(rows).outcome, i + 1
        k = outcomes.count("reproduced")
        assert swept.consistent("study", i) == k
        assert f"| study | {i + 1} | {FINDINGS[i].study} | {study.rows[i].outcome} | {k} of 2 seeds |" in text


def test_fleet_mini_judges_fine_tunes_against_a_distribution_of_twins(fleet: FleetPaths) -> None:
    accuracy = _records(fleet, "rq3", "rq3_finetune_accuracy")
    twins = sorted({r["node_label"] for r in accuracy if r["node_label"].startswith("golden-twin")})
    assert twins == ["golden-twin", "golden-twin-2", "golden-twin-3"]
    seeds = [
        LogReader(rank_dir(fleet.part("rq3").finetune(t), 0)).header.config["finetune"]["shuffle_seed"] for t in twins
    ]
    assert seeds == [1, 2, 3]
    # long enough to exercise rows 13-15: golden learns both tasks, and its twins do not all end alike
    assert len(learnt_tasks(accuracy)) == 2
    ends = {(r["node_label"], r["task"]): r["accuracy"] for r in accuracy if r["node_label"] in twins}
    assert any(len({ends[t, task] for t in twins}) > 1 for task in ("copy", "find")), ends
    disagreement = _records(fleet, "rq3", "rq3_finetune_disagreement")  # the pairs take the twins in turn
    assert {r["twin_node"] for r in disagreement} == set(twins)
    by_twin = {(r["twin_node"], r["task"]): r["baseline_disagreement"] for r in disagreement}
    assert all(by_twin[r["twin_node"], r["task"]] == r["baseline_disagreement"] for r in disagreement)
    text = fleet.reproduction.read_text(encoding="utf-8")
    assert "shuffle-seed twins' range" in text or "no twin baseline" in text
    # the plateau query: each fine-tune's first evaluation at chance + 10 points, from finetune_eval itself
    evals = LIBRARY.run(fleet.part("rq3").db, "SELECT run_id, task, step, accuracy, chance FROM finetune_eval").rows
    for r in _records(fleet, "rq3", "rq3_finetune_plateau"):
        steps = [s for run, task, s, a, c in evals if run == r["run_id"] and task == r["task"] and a >= c + 0.10]
        assert r["leaves_plateau_at"] == (min(steps) if steps else None)
        assert r["evaluations"] == sum(1 for run, task, *_ in evals if run == r["run_id"] and task == r["task"])


def test_rq1_fleet_nodes_equals_the_numbers_in_the_logs(fleet: FleetPaths) -> None:
    part = fleet.part("rq1")
    rows = {r["node_label"]: r for r in _records(fleet, "rq1", "rq1_fleet_nodes")}
    for label in _unhealthy(part):
        calls = [e.fields | {"step": e.step} for e in events(part.replay(label, "lockstep"), "site_mismatch")]
        per_step = Counter({c["step"]: 0 for c in calls})
        per_step.update(c["step"] for c in calls if c["mismatched"] > 0)
        counts = list(per_step.values())
        mean = statistics.fmean(counts)
        severities = [c["severity"] for c in calls if c["mismatched"] > 0 and c["severity"] is not None]
        checks: dict[tuple[Any, ...], bool] = defaultdict(bool)
        for e in events(part.run(label), "abft"):
            f = e.fields
            checks[e.step, f["microbatch"], f["site"], f["phase"], f["op"]] |= f["verdict"] == "flag"
        faults = [
            (e.step, e.fields["microbatch"], e.fields["site"], e.fields["phase"], e.fields["op"])
            for e in events(part.run(label), "fault")
        ]
        row = rows[label]
        assert row["steps_replayed"] == len(per_step)
        assert row["steps_mismatching"] == sum(1 for n in counts if n)
        assert row["mismatching_calls"] == sum(counts)
        assert row["frequency"] == pytest.approx(
            sum(c["mismatched"] for c in calls) / sum(c["elements"] for c in calls)
        )
        assert row["fano"] == (pytest.approx(statistics.pvariance(counts) / mean) if mean else None)
        injected = Counter({step: 0 for step in per_step})
        injected.update(e.step for e in events(part.run(label), "fault") if e.step in per_step)
        per_fault_step = list(injected.values())
        fault_mean = statistics.fmean(per_fault_step)
        assert row["faults_in_window"] == sum(per_fault_step)
        assert row["fault_steps"] == sum(1 for n in per_fault_step if n)
        assert row["fault_fano"] == (
            pytest.approx(statistics.pvariance(per_fault_step) / fault_mean) if fault_mean else None
        )
        assert row["median_severity"] == (pytest.approx(statistics.median(severities)) if severities else None)
        assert row["faults"] == len(faults)
        assert row["faults_outside_matmul"] == sum(1 for u in faults if u not in checks)
        assert row["faults_below_bound"] == sum(1 for u in faults if u in checks and not checks[u])
        assert row["abft_flagged"] == sum(1 for u in faults if checks.get(u))


def test_rq2_fleet_nodes_equals_the_numbers_in_the_logs(fleet: FleetPaths) -> None:
    part = fleet.part("rq2")
    rows = {r["node_label"]: r for r in _records(fleet, "rq2", "rq2_fleet_nodes")}
    assert set(rows) == set(_unhealthy(part))
    for label, row in rows.items():
        ratios = {
            e.step: e.fields["ratio"]
            for e in events(part.replay(label, "param-sync"), "grad_noise")
            if e.fields["name"] == "*"
        }
        worst = max(ratios.values())
        assert row["steps"] == len(ratios) and row["worst_ratio"] == pytest.approx(worst)
        assert row["worst_step"] == min(s for s, r in ratios.items() if r == worst)
        assert row["median_ratio"] == pytest.approx(statistics.median(ratios.values()))
        assert row["faults"] == len(events(part.run(label), "fault"))


# Done again in the copy: one node's jobs of two experiments (RQ2 and the hardware model's RQ1: its record, replays
# and diff), the golden twin's pretraining, its fine-tune and a diff of fine-tunes in RQ3, every report and the table.
_DONE_AGAIN = (
    "rq2/record:node-02",
    "rq2/replay:node-02:",
    "rq2/diff:node-02",
    "rq2/report",
    "hardware/rq1/record:node-02",
    "hardware/rq1/replay:node-02:",
    "hardware/rq1/diff:node-02",
    "hardware/rq1/report",
    "rq3/record:golden-twin",
    "rq3/diff:golden-twin",
    "rq3/finetune:golden-twin",
    "rq3/diff-finetune:node-01",
    "rq1/report",
    "rq3/report",
    "reproduction",
)


def test_jobs_done_again_in_another_folder_give_the_same_bytes(fleet: FleetPaths, tmp_path: Path) -> None:
    # Run ids derive from the study file, the node and its role (sdc.study.runner.derived_run_id), and no output
    # names the study's folder: a copy of the study elsewhere, its jobs done again there, gives the same table and
    # reports byte for byte, and the same run and pair ids
    again = tmp_path / "again"
    shutil.copytree(fleet.out, again)
    state_file = again / "study-state.json"
    state = json.loads(state_file.read_text())
    redo = [j for j in state["finished"] if j == _DONE_AGAIN[-1] or j.startswith(_DONE_AGAIN[:-1])]
    assert all(any(j.startswith(prefix) for j in redo) for prefix in _DONE_AGAIN), (_DONE_AGAIN, redo)
    state["finished"] = [j for j in state["finished"] if j not in redo]
    state_file.write_text(json.dumps(state))
    first = fleet
    again_paths = run_fleet_study(load_fleet_study("fleet-mini"), again, resume=True, progress=False).paths
    assert again_paths.reproduction.read_bytes() == first.reproduction.read_bytes()
    assert (again_paths.report / "index.html").read_bytes() == (first.report / "index.html").read_bytes()
    for part in ("rq1", "rq2", "rq3", "hardware/rq1"):
        reports = [(p.part(part).report / "index.html").read_bytes() for p in (first, again_paths)]
        assert reports[0] == reports[1], part
    for part in ("rq2", "hardware/rq1"):
        pairs = [
            LIBRARY.run(p.part(part).db, "SELECT pair_id FROM pairs ORDER BY 1").rows for p in (first, again_paths)
        ]
        assert pairs[0] == pairs[1] and pairs[0], part
    twin = [LogReader(rank_dir(p.part("rq3").run("golden-twin"), 0)).header.run_id for p in (first, again_paths)]
    finetuned = [
        LogReader(rank_dir(p.part("rq3").finetune("golden-twin"), 0)).header.run_id for p in (first, again_paths)
    ]
    assert twin[0] == twin[1] and finetuned[0] == finetuned[1] != twin[0]


def test_fleet_study_resumes_and_refuses_another_file(fleet: FleetPaths, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(load_fleet_study("fleet-mini").source.read_text().replace("nodes = 5", "nodes = 4"))
    assert main(["study", str(other), "--out", str(fleet.out), "--resume", "--quiet"]) != 0


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[fleet]\nnodes = 0\n", r"bad\.toml.*fleet\.nodes"),
        ("[fleet]\n[rq3]\nshuffle_seed = 0\n", r"bad\.toml.*rq3\.shuffle_seed"),
        ('[fleet]\nmodels = ["lab"]\n', r'bad\.toml.*fleet\.models.*"hardware"'),
        (
            '[fleet]\nmodels = ["study", "hardware"]\n[rq3]\nmodels = ["hardware"]\n',
            r"bad\.toml.*rq3\.models.*the first of \[fleet\]\.models",
        ),
        (
            '[fleet]\nmodels = ["study"]\n[rq3]\nmodels = ["hardware"]\n',
            r"bad\.toml.*rq3\.models.*not in \[fleet\]\.models",
        ),
        ("[fleet]\nnodes = 2\n[finetune]\ntwins = 6\n", r"bad\.toml.*finetune\.twins.*at least as many nodes"),
    ],
)
def test_a_fleet_file_names_its_mistakes(tmp_path: Path, text: str, error: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_fleet_study(bad)


def test_a_fleet_file_chooses_its_fleet_models(tmp_path: Path) -> None:
    fleet = load_fleet_study("fleet")
    assert fleet.models == ("study", "hardware") and not fleet.runs("hardware", "rq3")
    assert load_fleet_study("fleet-mini").models == ("study", "hardware")
    hardware = tmp_path / "hardware.toml"
    text = (
        load_fleet_study("fleet-mini")
        .source.read_text()
        .replace('models = ["study", "hardware"]', 'models = ["hardware"]')
    )
    hardware.write_text(re.sub(r'(?m)^models = \["study"\].*\n', "", text))
    study = load_fleet_study(hardware)
    assert study.models == ("hardware",) and study.fleets[0].model == "hardware"
    profiles = tmp_path / "profiles"
    study.write_profiles(profiles)
    assert (profiles / "node-01.toml").read_text() == hardware_fleet(study.fleets[0])[0].text
    assert "[[fault]]" in (profiles / "trigger-ulp.toml").read_text()
    state = tmp_path / "state.toml"  # the trigger as a [[state]] rule: one ulp of one parameter element
    parameter = 'trigger_parameter = "layers.0.attention.wo.weight"'
    state.write_text(hardware.read_text().replace("[rq3]\n", f"[rq3]\n{parameter}\n"))
    load_fleet_study(state).write_profiles(profiles)
    trigger = load_profile(profiles / "trigger-ulp.toml")
    assert not trigger.faults and [(s.parameter, s.step, s.bits) for s in trigger.states] == [
        ("layers.0.attention.wo.weight", load_fleet_study(state).rq3.trigger_step, 0)
    ]
