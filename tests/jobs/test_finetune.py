"""Fine-tuning on the generated multiple-choice tasks: tasks, events, determinism, pairing, faults, errors."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest

from jobs.finetune import finetune_run
from tests.support import TINY_FINETUNE as TINY
from tests.support import events
from tracer.compare import compare_runs
from tracer.errors import ConfigError, UsageError
from tracer.log import LogReader, Phase, TensorRecord, rank_dir
from tracer.pairing import baseline_differences, pairing_differences, twin_differences
from workload.multiple_choice import FinetuneSettings, collapsed
from workload.tasks import CHOICES, LADDER, LETTERS, MAX_PROMPT, TASK_NAMES, load_tasks, make_task


def header(run: Path):
    return LogReader(rank_dir(run, 0)).header


def test_tasks_are_deterministic_balanced_disjoint_and_fit_the_model() -> None:
    tasks = load_tasks(TASK_NAMES, seed=3, train=40, test=20)
    assert [t.name for t in load_tasks(seed=3, train=1, test=1)] == list(LADDER) and len(LADDER) >= 4
    assert set(LADDER) <= set(TASK_NAMES) and FinetuneSettings().tasks == LADDER
    again = load_tasks(TASK_NAMES, seed=3, train=40, test=20)
    assert [t.fingerprint for t in tasks] == [t.fingerprint for t in again]
    assert [t.test for t in tasks] == [t.test for t in again]
    for t in tasks:
        prompts = [ex.prompt for ex in (*t.train, *t.test)]
        assert len(set(prompts)) == len(prompts), f"{t.name}: a prompt repeats or is in both splits"
        assert all(len(p) <= MAX_PROMPT and p.endswith("\nAnswer: ") and p.isascii() for p in prompts)
        for split in (t.train, t.test):
            counts = [sum(ex.answer == a for ex in split) for a in range(CHOICES)]
            assert max(counts) - min(counts) <= 1, f"{t.name}: answers not balanced {counts}"
        assert t.chance == 1 / CHOICES
    other = make_task("copy", seed=4, train=40, test=20)
    assert other.fingerprint != tasks[0].fingerprint and other.test != tasks[0].test


def test_tasks_name_their_errors() -> None:
    with pytest.raises(ConfigError, match="unknown task 'nope'; choose from copy"):
        load_tasks(["copy", "nope"])
    with pytest.raises(ConfigError, match="each task may appear once"):
        load_tasks(["copy", "copy"])
    with pytest.raises(ConfigError, match="tasks copy,nope: name each once"):
        FinetuneSettings(tasks=("copy", "nope"))


def test_collapse_rule() -> None:
    assert collapsed(0.25, 0.25, 128) and collapsed(0.0, 0.25, 128) and collapsed(0.32, 0.25, 128)
    assert not collapsed(0.33, 0.25, 128) and not collapsed(0.9, 0.25, 8)
    assert collapsed(0.5, 0.25, 8)  # eight examples: half right is still within a guesser's reach


@pytest.mark.slow
def test_finetune_logs_evaluations_and_is_bit_exact(pretrained: Path, tuned: dict[str, Path]) -> None:
    a, b = tuned["golden"], tuned["node"]
    assert compare_runs(a, b).first is None
    for kind in ("finetune_eval", "finetune_prediction", "step", "loss", "checkpoint"):
        ea, eb = events(a, kind), events(b, kind)
        strip = lambda e: (e.step, {k: v for k, v in e.fields.items() if k != "wall_s"})  # noqa: E731
        assert [strip(e) for e in ea] == [strip(e) for e in eb] and ea, kind
    assert len(events(a, "step")) == TINY.steps

    evals = events(a, "finetune_eval")
    assert [(e.step, e.fields["task"]) for e in evals] == [(s, t) for s in (0, 2, 4) for t in TINY.tasks]
    predictions = events(a, "finetune_prediction")
    assert len(predictions) == 3 * len(TINY.tasks) * TINY.test_per_task
    tasks = {t.name: t for t in load_tasks(TINY.tasks, seed=TINY.task_seed, train=16, test=8)}
    for e in evals:
        mine = [p.fields for p in predictions if p.step == e.step and p.fields["task"] == e.fields["task"]]
        assert [p["example"] for p in mine] == list(range(TINY.test_per_task))
        assert [p["answer"] for p in mine] == [ex.answer for ex in tasks[e.fields["task"]].test]
        correct = sum(p["predicted"] == p["answer"] for p in mine)
        assert (e.fields["correct"], e.fields["examples"], e.fields["chance"]) == (correct, 8, 0.25)
        assert e.fields["accuracy"] == correct / 8 and e.fields["collapsed"] == collapsed(correct / 8, 0.25, 8)
    h = header(a)
    # Evaluation is not traced: each site's forward output is recorded once per step (one microbatch).
    forward = Counter(
        r.step for r in LogReader(rank_dir(a, 0)).records() if isinstance(r, TensorRecord) and r.phase == Phase.FORWARD
    )
    assert forward == {step: len(h.extra["sites"]) for step in range(TINY.steps)}
    assert h.role == "finetune" and h.extra["finetune_of"] == header(pretrained).run_id
    assert h.config["finetune"] == dataclasses.asdict(TINY) | {"tasks": list(TINY.tasks)}
    assert set(h.extra["tasks"]) == set(TINY.tasks) and h.extra["finetune"] == h.config["finetune"]
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == ["step-000000", "step-000002", "step-000004"]


@pytest.mark.slow
def test_nodes_pair_and_a_shuffle_twin_is_a_twin_not_a_pair(pretrained: Path, tuned: dict[str, Path]) -> None:
    golden, node, twin = (header(tuned[name]) for name in ("golden", "node", "twin"))
    assert pairing_differences(golden, node) == []
    assert {d.split(":")[0] for d in pairing_differences(golden, twin)} == {
        "config_fingerprint",
        "data_order_fingerprint",
    }
    assert twin_differences(golden, twin) == []
    assert compare_runs(tuned["golden"], tuned["twin"]).first is not None
    assert twin_differences(golden, node) == ["config.finetune.shuffle_seed: both 0 (a twin must differ here)"]
    longer = dataclasses.replace(twin, config={**twin.config, "finetune": {**twin.config["finetune"], "steps": 5}})
    assert twin_differences(golden, longer) == ["config.finetune.steps: 4 vs 5"]
    assert "role: 'train' vs 'finetune'" in " ".join(twin_differences(header(pretrained), twin))
    # a fine-tune twin is golden's baseline suspect too (`sdc diff --baseline`: its spikes are a null), a node is not
    assert baseline_differences(golden, twin) == []
    assert baseline_differences(golden, node) == twin_differences(golden, node) != []


@pytest.mark.slow
def test_an_unhealthy_node_fine_tunes_with_its_faults(tuned: dict[str, Path]) -> None:
    faults = events(tuned["sick"], "fault")
    assert faults and all(f.step == 1 and f.fields["phase"] == "forward" for f in faults)
    assert all(f.fields["site"].startswith("layers.0.feed_forward") for f in faults)
    first = compare_runs(tuned["golden"], tuned["sick"]).first
    assert first is not None and first.step == 1
    sick = header(tuned["sick"])
    assert pairing_differences(header(tuned["golden"]), sick) == []
    assert sick.extra["fault_profile"]["seed"] == 2


@pytest.mark.slow
def test_fine_tune_errors_name_the_run_and_the_fix(
    pretrained: Path, tuned: dict[str, Path], run_factory, tmp_path: Path
) -> None:
    no_final = run_factory("no-final", "run.checkpoint_every=0")
    with pytest.raises(UsageError, match=r"no-final: no final checkpoint \(step 4; checkpoints at steps none\)"):
        finetune_run(no_final, tmp_path / "x", node_label="x", progress=False, settings=TINY)
    with pytest.raises(UsageError, match="is a fine-tune .*pass --from a pretraining run"):
        finetune_run(tuned["golden"], tmp_path / "y", node_label="y", progress=False, settings=TINY)
    with pytest.raises(UsageError, match="pass --overwrite"):
        finetune_run(pretrained, tuned["golden"], node_label="g", progress=False, settings=TINY)


def solve(name: str, prompt: str) -> int:
    """The ladder task's answer, worked out from the prompt alone."""
    question, listed, _ = prompt.split("\n")
    options = [o[3:] for o in re.split(r" (?=[A-D]\) )", listed)]
    if name in ("copy", "find"):
        return LETTERS.index(re.search(r"answer is ([A-D])\.", question).group(1))
    if name == "exclude":
        return LETTERS.index(next(x for x in LETTERS if x not in question[4:]))
    if name == "longest":
        return max(range(CHOICES), key=lambda i: len(options[i]))
    return options.index(question[len("Which is ") : -1])  # match


def test_every_ladder_answer_follows_from_its_prompt_at_the_default_sizes() -> None:
    for task in load_tasks(seed=0):
        assert len(task.train) == 512 and len(task.test) == 128
        assert all(solve(task.name, ex.prompt) == ex.answer for ex in (*task.train, *task.test)), task.name


# The output projection stuck at NaN at the first step: the loss, every gradient and, after the
# optimizer step, every weight are NaN, as on a node whose fine-tune was destroyed.
NAN_AT_0 = """
description = "the output matmuls all NaN at step 0"
seed = 1
fault = [{ops = ["matmul"], sites = "output", steps = [0], fraction = 1.0, kind = "stuck", value = nan}]
"""


@pytest.mark.slow
def test_a_fine_tune_with_nan_weights_is_at_or_below_chance_and_collapsed(pretrained: Path, tmp_path: Path) -> None:
    import torch

    from faults import load_profile
    from tracer.checkpoint import load_checkpoint

    (tmp_path / "nan.toml").write_text(NAN_AT_0, encoding="utf-8")
    settings = dataclasses.replace(TINY, steps=2, test_per_task=12)
    summary = finetune_run(
        pretrained,
        tmp_path / "ft",
        node_label="nan",
        progress=False,
        settings=settings,
        fault_profile=load_profile(tmp_path / "nan.toml"),
    )
    weights = load_checkpoint(tmp_path / "ft", settings.steps).model
    assert all(torch.isnan(w).all() for w in weights.values() if w.is_floating_point())
    assert [e.task for e in summary.final] == list(settings.tasks)
    assert all(e.accuracy <= e.chance and e.collapsed for e in summary.final), summary.final
    final = [e.fields for e in events(tmp_path / "ft", "finetune_eval") if e.step == settings.steps]
    assert all(f["accuracy"] <= f["chance"] and f["collapsed"] for f in final) and len(final) == len(settings.tasks)
