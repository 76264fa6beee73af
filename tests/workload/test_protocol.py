"""The workload protocol: entry points, configs, run settings and one step, on a real user workload."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.any_training import gpt
from tracer.errors import ConfigError
from workload.protocol import RunSettings, build_workload, load_factory, load_workload_config, run_step


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("no colon", "expected package.module:factory"),
        ("no_such_module_here:build", "cannot import no_such_module_here"),
        ("tests.any_training.gpt:nothing", "has no function 'nothing'"),
        ("tests.any_training.gpt:DEFAULTS", "has no function 'DEFAULTS'"),
    ],
)
def test_a_bad_entry_point_is_one_config_error(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_factory(entry)


def not_a_workload(config: dict, device: torch.device) -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


def test_a_factory_must_return_a_workload() -> None:
    with pytest.raises(ConfigError, match="returned Linear, not a workload.protocol.Workload"):
        build_workload("tests.workload.test_protocol:not_a_workload", {}, torch.device("cpu"))


def test_config_file_overrides_and_run_settings(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[model]\nlayers = 3\n[run]\nsteps = 7\n", encoding="utf-8")
    config = load_workload_config(path, ["model.dim=16", "run.checkpoint_every=0", "data.name=counting"])
    assert config == {
        "model": {"layers": 3, "dim": 16},
        "run": {"steps": 7, "checkpoint_every": 0},
        "data": {"name": "counting"},
    }
    assert RunSettings.of(config) == RunSettings(steps=7, checkpoint_every=0)
    assert RunSettings.of({}) == RunSettings()
    with pytest.raises(ConfigError, match="unknown key run.stepz"):
        RunSettings.of({"run": {"stepz": 3}})
    with pytest.raises(ConfigError, match="run.steps = 0 must be an integer >= 1"):
        RunSettings.of({"run": {"steps": 0}})
    with pytest.raises(ConfigError, match="no such file"):
        load_workload_config(tmp_path / "missing.toml")


def test_a_step_without_update_leaves_the_final_gradients_and_the_parameters() -> None:
    w = gpt.build({"model": {"layers": 1}}, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in w.model.named_parameters()}
    loss = run_step(w, 0, update=False)
    assert loss > 0
    assert all(torch.equal(before[n], p) for n, p in w.model.named_parameters())
    norm = torch.nn.utils.get_total_norm([p.grad for p in w.model.parameters()])
    assert norm <= w.grad_clip * (1 + 1e-6)  # finish_backward clipped them
    run_step(w, 0)
    assert not all(torch.equal(before[n], p) for n, p in w.model.named_parameters())


def test_a_subclass_s_own_post_init_runs_whether_or_not_it_is_a_dataclass() -> None:
    from dataclasses import dataclass

    from workload.protocol import Workload

    class Plain(Workload):
        def __post_init__(self) -> None:
            self.built = type(self.model).__name__

    @dataclass
    class Declared(Workload):
        extra: int = 3

        def __post_init__(self) -> None:
            super().__post_init__()
            self.built = self.extra

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert Plain(model=model, optimizer=optimizer, config={}).built == "Linear"
    assert Declared(model=model, optimizer=optimizer, config={}).built == 3
