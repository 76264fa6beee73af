"""The fleet model: deterministic files that load, the documented shape, the trigger node, `sdc faults fleet`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from faults import FaultProfile, load_profile
from faults.fleet import (
    CALLS_PER_STEP,
    DESTROY_STEP,
    LOCATIONS,
    FleetNode,
    FleetSpec,
    fleet,
    trigger_profile_text,
    trigger_state_text,
)
from faults.fleet_files import write_fleet
from jobs.record import record_run
from sdc.cli import main
from tests.faults.support import events
from tests.support import small_config
from tracer.compare import compare_runs
from tracer.errors import ConfigError
from tracer.log.records import Phase

WINDOW = 24  # steps of the fleet study's RQ1 lockstep window


def loaded(node: FleetNode, tmp: Path) -> FaultProfile:
    path = tmp / f"{node.label}.toml"
    path.write_text(node.text, encoding="utf-8")
    return load_profile(path)


def expected_calls(profile: FaultProfile) -> float:
    """Faulty calls per step on the reference model, summed over the profile's rules (bursts included)."""
    total = 0.0
    for rule in profile.faults:
        if rule.roles is not None:
            continue
        location = next(loc for loc in LOCATIONS if loc in rule.ops)  # the normalisation rule names it first
        s = rule.schedule
        total += rule.p_call * CALLS_PER_STEP[location] * s.p_enter / (s.p_enter + s.p_exit)
    return total


def test_the_same_spec_writes_the_same_bytes_and_every_file_loads(tmp_path: Path) -> None:
    a, b, other = tmp_path / "a", tmp_path / "b", tmp_path / "other"
    paths = write_fleet(FleetSpec(), a)
    write_fleet(FleetSpec(), b)
    write_fleet(FleetSpec(seed=FleetSpec().seed + 1), other)
    assert [p.name for p in paths] == [f"node-{i:02d}.toml" for i in range(1, 16)]
    assert sorted(p.name for p in a.iterdir()) == sorted([*(p.name for p in paths), "fleet.md"])
    for name in [*(p.name for p in paths), "fleet.md"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "node-01.toml").read_bytes() != (other / "node-01.toml").read_bytes()
    for node, path in zip(fleet(FleetSpec()), paths):
        profile = load_profile(path)
        assert profile.name == node.label and path.read_text(encoding="utf-8") == node.text
        assert profile.description.startswith(f"fleet {node.label}:")
    table = (a / "fleet.md").read_text(encoding="utf-8").splitlines()
    assert sum(line.startswith("| node-") for line in table) == 15


def test_the_files_say_what_the_node_drew(tmp_path: Path) -> None:
    checked = 0
    for node in fleet(FleetSpec()):
        assert math.isclose(sum(share for _, share in node.mix), 1.0, abs_tol=0.03), node.mix
        profile = loaded(node, tmp_path)
        if all(r.p_call < 1 for r in profile.faults if r.roles is None):  # a saturated rule delivers less
            assert math.isclose(expected_calls(profile), node.rate, rel_tol=0.03), node.label
            checked += 1
        tails = [r for r in profile.faults if r.corruption.kind == "scale"]
        assert all(r.corruption.factor == (100.0, 1000.0) and r.elements == 1 for r in tails)
    assert checked >= 10


def test_the_default_fleet_has_the_documented_shape(tmp_path: Path) -> None:
    nodes = fleet(FleetSpec())
    rates = [n.rate for n in nodes]
    assert max(rates) / min(rates) > 1e3, "rates must span orders of magnitude"
    silent = [n for n in nodes if n.rate * WINDOW < 0.2]
    frequent = [n for n in nodes if n.rate >= 3 and n.duty < 0.5]  # bursty: in a burst on a minority of steps
    assert all(n.tail_share < 0.01 for n in frequent), "a frequent node's faults are mostly small"
    heavy = [n for n in nodes if n.tail_share >= 0.3 and n.rate * n.tail_share * WINDOW >= 0.36]
    outside = [n for n in nodes if n.rate >= 1 and dict(n.mix).get("matmul", 0) <= 0.6]
    assert len(silent) >= 2 and len(frequent) >= 2 and heavy and outside
    destroyers = [n for n in nodes if n.destroyer]
    assert len(destroyers) == 1
    (rule,) = [r for r in loaded(destroyers[0], tmp_path).faults if r.roles is not None]
    assert rule.roles == ("finetune",) and rule.schedule.steps == (DESTROY_STEP,)
    assert rule.corruption.kind == "stuck" and rule.corruption.value == math.inf and rule.sites == "output"
    assert all("roles" not in n.text for n in nodes if not n.destroyer)


def test_a_fleet_spans_its_rates_for_any_seed() -> None:
    for seed in range(5):
        rates = [n.rate for n in fleet(FleetSpec(nodes=8, seed=seed))]
        assert max(rates) / min(rates) > 100 and max(rates) > 3, (seed, rates)


def test_a_spec_out_of_range_is_an_error() -> None:
    with pytest.raises(ConfigError, match="1 to 99 nodes, not 0"):
        FleetSpec(nodes=0)
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        FleetSpec(seed=-1)


def test_the_trigger_flips_one_element_by_one_ulp(tmp_path: Path) -> None:
    path = tmp_path / "trigger-ulp.toml"
    path.write_text(trigger_profile_text(2), encoding="utf-8")
    out = tmp_path / "trigger"
    record_run(small_config(), out, node_label="trigger-ulp", fault_profile=load_profile(path), progress=False)
    (fault,) = events(out, "fault")
    assert fault.step == 2 and fault.fields["site"] == "layers.0.attention.wo" and fault.fields["elements"] == 1
    (original,), (corrupted,) = fault.fields["original"], fault.fields["corrupted"]
    o, c = torch.tensor(original, dtype=torch.float32), torch.tensor(corrupted, dtype=torch.float32)
    toward = torch.tensor(math.inf if c > o else -math.inf)
    assert c != o and torch.equal(torch.nextafter(o, toward), c), (original, corrupted)


def test_the_triggers_fire_in_pretraining_alone(tmp_path: Path) -> None:
    # A fine-tune counts its steps from 0 again: without roles, the trigger would fire at its step there too.
    for name, text in (("matmul", trigger_profile_text(2)), ("state", trigger_state_text(2, "layers.0.ffn.w1"))):
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        profile = load_profile(path)
        assert [r.roles for r in (*profile.faults, *profile.states)] == [("train",)], name


def test_the_state_trigger_flips_one_parameter_element_by_one_ulp(healthy_run: Path, tmp_path: Path) -> None:
    name = "layers.0.attention.wo.weight"
    path = tmp_path / "trigger-ulp.toml"
    path.write_text(trigger_state_text(2, name), encoding="utf-8")
    out = tmp_path / "trigger"
    record_run(small_config(), out, node_label="trigger-ulp", fault_profile=load_profile(path), progress=False)
    (fault,) = events(out, "fault")
    assert fault.step == 2 and fault.fields["op"] == "state" and fault.fields["detail"]["parameter"] == name
    assert fault.fields["detail"]["bits"] == [0]
    first = compare_runs(healthy_run, out).first
    assert first is not None and (first.step, first.phase, first.name) == (2, Phase.PARAM, name)
    with pytest.raises(ConfigError, match="trigger step must be an integer >= 0"):
        trigger_state_text(-1, name)


def test_sdc_faults_fleet_writes_and_lists_the_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet"
    assert main(["faults", "fleet", "--nodes", "3", "--seed", "4", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(
        line.startswith(str(out / f"node-{i:02d}.toml")) for i, line in zip((1, 2, 3), lines)
    )
    assert sorted(p.name for p in out.iterdir()) == ["fleet.md", "node-01.toml", "node-02.toml", "node-03.toml"]
    assert (out / "node-02.toml").read_text(encoding="utf-8") == fleet(FleetSpec(nodes=3, seed=4))[1].text
    assert main(["faults", "fleet", "--nodes", "3", "--seed", "4", "--out", str(out), "--overwrite"]) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nodes", "0"], "a fleet has 1 to 99 nodes, not 0"),
        (["--nodes", "100"], "a fleet has 1 to 99 nodes, not 100"),
        (["--out-is-file"], "is a file; give a directory"),
        (["--out-not-empty"], "is not empty; pass --overwrite"),
    ],
)
def test_sdc_faults_fleet_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "fleet"
    if args == ["--out-is-file"]:
        out.write_text("x", encoding="utf-8")
        args = []
    elif args == ["--out-not-empty"]:
        out.mkdir()
        (out / "mine.txt").write_text("x", encoding="utf-8")
        args = []
    assert main(["faults", "fleet", "--out", str(out), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and message in err and err.count("\n") == 1
    assert not out.is_dir() or sorted(p.name for p in out.iterdir()) in ([], ["mine.txt"])


def test_sdc_faults_fleet_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["faults", "fleet", "--help"])
    assert exit.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--nodes" in out and "--overwrite" in out and "docs/fleet.md" in out and "byte for byte" in out
