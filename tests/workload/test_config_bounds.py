"""Every number of a config is bounded at load by what the code that uses it takes (issue 31, cases 9 and 10): seeds
by torch.manual_seed and TOML's 64-bit integers, step counts by the largest step a log records, learning rates and
epsilons finite. A study TOML nested thousands deep is one line with a reason, not an empty RecursionError. Each
refusal is a `ConfigError` naming the file (or override), the key and the bound, before anything is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdc.cli import main
from sdc.study.study_file import load_study
from tests.sdc.test_study import study_file
from tracer.errors import ConfigError
from tracer.log.records import MAX_STEP
from workload.multiple_choice import FinetuneSettings
from workload.reference_config import load_config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "train.seed=9223372036854775808",
            "train.seed = 9223372036854775808 must be an integer in 0..9223372036854775807",
        ),
        ("train.seed=18446744073709551616", "train.seed = 18446744073709551616 must be an integer in 0.."),
        (
            "data.shuffle_seed=100000000000000000000",
            "data.shuffle_seed = 100000000000000000000 must be an integer in 0..",
        ),
        ("train.threads=100000000000000000000", "train.threads holds the integer 1e+20, beyond the 64-bit integers"),
        ("optim.lr=inf", "optim.lr = inf must be a finite number > 0"),
        ("optim.lr=nan", "optim.lr = nan must be a finite number > 0"),
        ("optim.eps=inf", "optim.eps = inf must be a finite number > 0"),
        ("optim.grad_clip=inf", "optim.grad_clip = inf must be a finite number >= 0"),
        ("optim.weight_decay=1e400", "optim.weight_decay = inf must be a finite number >= 0"),
        ("model.norm_eps=inf", "model.norm_eps = inf must be a finite number > 0"),
        (
            "optim.schedule_steps=9223372036854775807",
            f"optim.schedule_steps = 9223372036854775807 must be an integer in 0..{MAX_STEP}",
        ),
        ("run.steps=100000000000000000000", "run.steps = 100000000000000000000 must be in 1.."),
        ("train.seed=" + "9" * 5000, "too long an integer"),
    ],
)
def test_config_number_beyond_what_the_code_takes_is_refused_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^override") as err:
        load_config("tiny", [override])
    assert message in str(err.value), err.value


def test_the_largest_seed_torch_takes_loads() -> None:
    assert load_config("tiny", [f"train.seed={2**63 - 1}"]).train.seed == 2**63 - 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"steps": 10**20}, f"fine-tune steps = {10**20} must be <= {MAX_STEP}"),
        ({"steps": MAX_STEP + 1}, f"must be <= {MAX_STEP}"),
        ({"shuffle_seed": 2**63}, f"fine-tune shuffle_seed = {2**63} must be <= {2**63 - 1}"),
        ({"train_per_task": 10**12}, "fine-tune train_per_task"),
        ({"lr": float("inf")}, "fine-tune lr = inf must be a finite number"),
        ({"grad_clip": float("inf")}, "fine-tune grad_clip = inf must be a finite number"),
    ],
)
def test_finetune_settings_are_bounded(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FinetuneSettings(**settings)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("steps = 100000000000000000000", "finetune.steps"),
        ("twin_shuffle_seed = 100000000000000000000", "finetune.twin_shuffle_seed"),
        ("twin_shuffle_seed = -1", "finetune.twin_shuffle_seed"),
    ],
)
def test_study_finetune_numbers_are_bounded_at_load(tmp_path: Path, body: str, key: str) -> None:
    path = study_file(tmp_path, finetune=f"enabled = true\n{body}")
    with pytest.raises(ConfigError, match=f"^{path}: {key}"):
        load_study(path)


@pytest.mark.parametrize("seed", ["100000000000000000000", "-3"])
def test_study_fault_seed_is_bounded_at_load(tmp_path: Path, seed: str) -> None:
    path = study_file(tmp_path)
    path.write_text(path.read_text().replace("abft = true", f"abft = true\nfault_seed = {seed}"))
    with pytest.raises(ConfigError, match=rf"^{path}: node\[1\]\.fault_seed"):
        load_study(path)


def test_study_optim_lr_inf_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    path = study_file(tmp_path)
    path.write_text(path.read_text().replace("set = [", 'set = ["optim.lr=inf", '))
    assert main(["study", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and err.count("\n") == 1 and "optim.lr = inf must be a finite" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "nested",
    ["a = " + "[" * 5000 + "]" * 5000, "a = " + "{b = " * 5000 + "1" + "}" * 5000, "a = " + "[" * 70 + "]" * 70],
)
def test_a_study_nested_thousands_deep_is_one_line_with_a_reason(tmp_path: Path, capsys, nested: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(nested + "\n")
    assert main(["study", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sdc: error: {path}: ") and err.count("\n") == 1 and "nest" in err, err
