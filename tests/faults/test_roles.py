"""A rule's ``roles``: faults that strike only while pretraining or only while fine-tuning."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from faults import load_profile
from faults.fleet import destroyer_rule_text
from jobs.finetune import finetune_run
from jobs.record import record_run
from tests.faults.support import events
from tests.support import TINY_FINETUNE, small_config
from tracer.checkpoint import load_checkpoint
from tracer.errors import ConfigError


def test_roles_default_to_every_role_and_are_validated(write_profile) -> None:
    (rule,) = write_profile('[[fault]]\nops = ["matmul"]\nkind = "bitflip"\n').faults
    assert rule.roles is None
    (rule,) = write_profile('[[fault]]\nops = ["matmul"]\nkind = "bitflip"\nroles = ["finetune", "train"]\n').faults
    assert rule.roles == ("train", "finetune")
    with pytest.raises(
        ConfigError,
        match=r"fault\[0\]\.roles must be a non-empty array of \"train\" and/or \"finetune\", "
        r"found array \['pretrain'\]",
    ):
        write_profile('[[fault]]\nops = ["matmul"]\nkind = "bitflip"\nroles = ["pretrain"]\n')
    with pytest.raises(ConfigError, match=r"fault\[0\]\.roles = \[\] must be a non-empty array"):
        write_profile('[[fault]]\nops = ["matmul"]\nkind = "bitflip"\nroles = []\n')


@pytest.mark.slow
def test_pretraining_fires_only_its_own_roles_rules(tmp_path: Path) -> None:
    text = """
[[fault]]
roles = ["finetune"]
ops = ["matmul"]
sites = "layers\\\\.0\\\\.attention\\\\.wq"
steps = [1]
kind = "bitflip"
[[fault]]
roles = ["train"]
ops = ["matmul"]
sites = "layers\\\\.1\\\\.attention\\\\.wq"
phases = ["forward"]
steps = [1]
kind = "bitflip"
"""
    path = tmp_path / "split.toml"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "run"
    record_run(small_config(), out, node_label="split", fault_profile=load_profile(path), progress=False)
    faults = events(out, "fault")
    assert faults and {f.fields["site"] for f in faults} == {"layers.1.attention.wq"}


@pytest.mark.slow
def test_a_finetune_only_spike_destroys_the_fine_tune_and_nothing_else(pretrained: Path, tmp_path: Path) -> None:
    runs = {}
    destroyer = destroyer_rule_text(step=1)  # the fleet's, at step 1 of TINY_FINETUNE's four
    for name, text in (("destroyed", destroyer), ("spared", destroyer.replace('"finetune"', '"train"'))):
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        summary = finetune_run(
            pretrained,
            tmp_path / name,
            node_label=name,
            progress=False,
            settings=TINY_FINETUNE,
            fault_profile=load_profile(path),
        )
        weights = load_checkpoint(tmp_path / name, TINY_FINETUNE.steps).model
        runs[name] = summary, weights
    summary, weights = runs["destroyed"]
    assert [f.step for f in events(tmp_path / "destroyed", "fault")] == [1]
    assert not math.isfinite(summary.losses[1])
    assert all(torch.isnan(w).all() for w in weights.values() if w.is_floating_point())
    assert all(t.accuracy <= t.chance for t in summary.final)
    summary, weights = runs["spared"]
    assert not events(tmp_path / "spared", "fault")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert all(math.isfinite(loss) for loss in summary.losses)
