"""Study files and `sdc study`: validation, the whole flow on a small study, resume and overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from analysis.queries import LIBRARY
from sdc.cli import main
from sdc.study.runner import StudyPaths, plan_jobs
from sdc.study.study_file import load_study, shipped_studies
from tests.support import ONE_FLIP, SMALL
from tracer.errors import ConfigError

SMALL_SET = json.dumps([kv for kv in SMALL if not kv.startswith("run.")] + ["run.steps=5", "run.checkpoint_every=2"])


def study_file(tmp_path: Path, body: str = "", *, finetune: str = "enabled = false") -> Path:
    (tmp_path / "one-flip.toml").write_text(ONE_FLIP)
    path = tmp_path / "small.toml"
    path.write_text(f"""
description = "two nodes on a small workload"
[train]
set = {SMALL_SET}
[[node]]
label = "twin"
profile = "healthy-node"
[[node]]
label = "flip"
profile = "one-flip.toml"
abft = true
[replay]
steps = "2:5"
[finetune]
{finetune}
{body}
""")
    return path


def test_shipped_studies_load() -> None:
    assert {"demo"} <= set(shipped_studies())
    for name in shipped_studies():
        if name.startswith("fleet"):
            continue  # tests/sdc/test_fleet_study.py
        study = load_study(name)
        assert study.nodes and study.replay.modes and study.train.run.checkpoint_every > 0
    demo = load_study("demo")
    profiles = {n.profile for n in demo.nodes}
    assert "healthy-node" in profiles and len(profiles - {"healthy-node"}) >= 3


def test_paths_in_a_study_are_relative_to_its_file(tmp_path: Path) -> None:
    study = load_study(study_file(tmp_path))
    assert study.nodes[1].profile == str(tmp_path / "one-flip.toml")
    assert study.train.model.n_layers == 2 and study.train.run.steps == 5
    assert study.replay.steps == range(2, 5) and study.finetune is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[extra]\nx = 1", "unknown key extra"),
        ("[replay.more]\n", "unknown key replay.more"),
        ('[golden]\nlabel = "twin"', "used twice"),
        ('[golden]\nlabl = "g"', r"did you mean golden\.label\?"),
        (
            '[[node]]\nlabel = "x"\nprofile = "no-such-profile"',
            r"node\[2\]\.profile: fault profile .no-such-profile. not found",
        ),
        ('[[node]]\nlabel = "x"', r"node\[2\]\.profile is missing"),
        ('[[node]]\nlabel = "x-twin"\nprofile = "healthy-node"', "must be letters"),
        ('[[node]]\nlabel = "x"\nprofile = "healthy-node"\nabft = "yes"', "abft must be true or false"),
        ('[[node]]\nlabel = "x-guarded"\nprofile = "healthy-node"', "must be letters"),
        (
            '[[node]]\nlabel = "x"\nprofile = "healthy-node"\nguard = "retry"',
            r"node\[2\]\.guard = 'retry' must be one of continue, skip, stop",
        ),
    ],
)
def test_bad_study_files_name_the_key(tmp_path: Path, body: str, message: str) -> None:
    path = study_file(tmp_path, body)
    with pytest.raises(ConfigError, match=message) as err:
        load_study(path)
    assert str(path) in str(err.value)


def test_the_finetune_table_sets_the_batch_size(tmp_path: Path) -> None:
    study = load_study(study_file(tmp_path, finetune="steps = 2\nbatch_size = 8"))
    assert study.finetune is not None and study.finetune.settings.batch_size == 8
    with pytest.raises(ConfigError, match=r"finetune\.batch_size = 0 must be >= 1"):
        load_study(study_file(tmp_path, finetune="steps = 2\nbatch_size = 0"))


def test_a_guarded_node_is_recorded_diffed_and_fine_tuned_a_second_time(tmp_path: Path) -> None:
    path = study_file(tmp_path, finetune="steps = 2")
    path.write_text(path.read_text().replace("abft = true", 'abft = true\nguard = "skip"'))
    study = load_study(path)
    assert [(n.label, n.guard, n.guarded) for n in study.nodes] == [
        ("twin", None, None),
        ("flip", "skip", "flip-guarded"),
    ]
    jobs = [j.name for j in plan_jobs(study, StudyPaths(tmp_path / "out"), progress=False, beam_args=())]
    guarded = [j for j in jobs if j.endswith("flip-guarded")]
    assert guarded == [
        "record:flip-guarded",
        "diff:flip-guarded",
        "finetune:flip-guarded",
        "diff-finetune:flip-guarded",
    ]
    assert jobs.index("record:flip-guarded") < jobs.index("diff:flip-guarded") < jobs.index("finetune:flip-guarded")


def test_replay_window_and_mode_are_checked(tmp_path: Path) -> None:
    path = study_file(tmp_path)
    path.write_text(path.read_text().replace('steps = "2:5"', 'steps = "2:9"'))
    with pytest.raises(ConfigError, match=r"replay.steps: '2:9' reaches past the 5 recorded steps"):
        load_study(path)
    path.write_text(path.read_text().replace('steps = "2:9"', 'steps = "2:5"\nmodes = ["lockstep", "sync"]'))
    with pytest.raises(ConfigError, match=r"'sync' is not a replay mode"):
        load_study(path)


def test_study_without_checkpoints_or_on_many_ranks_is_refused(tmp_path: Path) -> None:
    path = study_file(tmp_path)
    with pytest.raises(ConfigError, match="need checkpoints"):
        load_study(path, ("run.checkpoint_every=0",))
    with pytest.raises(ConfigError, match="studies run single-rank"):
        load_study(path, ("parallel.tp=2",))


@pytest.mark.slow
def test_small_study_end_to_end_then_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = study_file(tmp_path, finetune='steps = 2\ntasks = ["copy"]'), tmp_path / "out"
    path.write_text(path.read_text().replace("abft = true", 'abft = true\nguard = "skip"'))
    assert main(["study", str(path), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    for job in (
        "record golden",
        "record twin",
        "record flip",
        "replay flip lockstep 2:5",
        "diff golden vs flip",
        "fine-tune golden-twin (shuffle seed 1, 2 steps)",
        "diff fine-tuned golden vs flip",
        "record flip-guarded (",
        "diff golden vs flip-guarded",
        "guard_detector_scores",
        "guard_outcome",
    ):
        assert job in text
    assert (out / "runs" / "flip" / "rank-00000").is_dir() and (out / "replays" / "twin-param-sync").is_dir()
    assert "Beam job" in (out / "study.log").read_text()  # the jobs' own output, kept out of the terminal
    assert "summary: Overview" in text and "rq2_noise_worst" in text and "sdc query --sql" in text
    page = (out / "report" / "index.html").read_text()
    assert 'src="rq1_frequency.png"' in page and 'src="rq3_finetune.png"' in page  # every section had data
    con = duckdb.connect(str(out / "study.duckdb"), read_only=True)
    try:
        rows = dict(
            con.execute(
                "SELECT r.node_label, count(*) FILTER (NOT d.equal) FROM event_diffs d JOIN pairs p USING (pair_id) "
                "JOIN runs r ON r.run_id = p.suspect_run_id GROUP BY 1"
            ).fetchall()
        )
        noise = dict(
            con.execute(
                "SELECT r.node_label, max(g.ratio) FROM grad_noise g JOIN pairs p USING (pair_id) "
                "JOIN runs r ON r.run_id = p.suspect_run_id WHERE g.name = '*' GROUP BY 1"
            ).fetchall()
        )
        finetuned = dict(
            con.execute(
                "SELECT r.node_label, count(*) FROM finetune_eval e JOIN runs r USING (run_id) GROUP BY 1"
            ).fetchall()
        )
        decisions = con.execute("SELECT node_label, step, detectors FROM guard_decisions").fetchall()
        baseline = set(
            con.execute(
                "SELECT suspect_node, baseline_disagreement IS NOT NULL FROM ("
                + LIBRARY.sql("rq3_finetune_disagreement")
                + ")"
            ).fetchall()
        )
    finally:
        con.close()
    assert rows["twin"] == 0 and rows["flip"] > 0  # the fault fires at step 3
    assert noise["twin"] == 0 and noise["flip"] > 0
    assert set(finetuned) == {"golden", "golden-twin", "twin", "flip", "flip-guarded"}
    assert baseline == {("twin", True), ("flip", True), ("flip-guarded", True)}
    assert decisions == [
        ("flip-guarded", 3, ["abft_flags"])
    ]  # ABFT flags the flip; the other detectors lack history  # both fine-tune pairs carry the shuffle-seed baseline

    state = json.loads((out / "study-state.json").read_text())
    # records, replays, diffs, fine-tunes, their diffs (the fine-tune twin's against golden too: row 12's null), report
    assert len(state["finished"]) == 4 + 2 * 2 + 3 + 5 + 4 + 1
    assert main(["study", str(path), "--out", str(out), "--quiet"]) == 1
    assert "already holds a study; pass --overwrite" in capsys.readouterr().err

    state["finished"] = state["finished"][:-1]  # as if the last diff had crashed
    (out / "study-state.json").write_text(json.dumps(state))
    assert main(["study", str(path), "--out", str(out), "--quiet", "--resume"]) == 0
    text = capsys.readouterr().out
    assert text.count("skipped (--resume)") == len(state["finished"]) and "diff golden vs flip:" in text

    assert main(["study", str(path), "--out", str(out), "--quiet", "--resume", "--set", "optim.lr=0.002"]) == 1
    assert "different study file or overrides" in capsys.readouterr().err
