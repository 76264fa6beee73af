"""The hardware-grounded fleet model: seeded and stable files that load, the cited proportions over a large fleet,
its patterns (multi-bit flips, warp-periodic hits) under the real emulator, and `sdc faults fleet --model hardware`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from faults import FaultProfile, load_profile
from faults.emulator import FaultEmulator
from faults.fleet import CALLS_PER_STEP, LOCATIONS, MODELS, FleetSpec, fleet
from faults.fleet_files import drawn, write_fleet
from faults.fleet_hardware import (
    CHOICE,
    MULTI_BIT_FLIPS,
    NAN_INF_SHARE,
    PERIODIC_ELEMENTS,
    RATE,
    SINGLE_BIT_SHARE,
    SOURCES,
    TENSOR_CORE_SHARE,
    WARP,
    HardwareNode,
    hardware_fleet,
)
from jobs.record import record_run
from sdc.cli import main
from tests.faults.support import events
from tests.support import small_config
from tracer.errors import ConfigError

HARDWARE = FleetSpec(model="hardware")
# Large fleets: 5 seeds x 99 nodes.
LARGE = [node for seed in range(1, 6) for node in hardware_fleet(FleetSpec(nodes=99, seed=seed, model="hardware"))]


def loaded(node: HardwareNode, tmp: Path) -> FaultProfile:
    path = tmp / f"{node.label}.toml"
    path.write_text(node.text, encoding="utf-8")
    return load_profile(path)


def calls_by_outcome(profile: FaultProfile) -> dict[str, float]:
    """Expected faulty calls per step on the reference model, by outcome class, read from the profile's rules."""
    out: dict[str, float] = {}
    for rule in profile.faults:
        location = next(loc for loc in LOCATIONS if loc in rule.ops)  # the normalisation rule names it first
        c = rule.corruption
        outcome = ("single-bit" if c.flips == (1, 1) else "multi-bit") if c.kind == "bitflip" else "non-finite"
        out[outcome] = out.get(outcome, 0.0) + rule.p_call * CALLS_PER_STEP[location]
    return out


def test_the_same_spec_writes_the_same_bytes_and_every_file_loads(tmp_path: Path) -> None:
    a, b, other = tmp_path / "a", tmp_path / "b", tmp_path / "other"
    paths = write_fleet(HARDWARE, a)
    write_fleet(HARDWARE, b)
    write_fleet(FleetSpec(seed=HARDWARE.seed + 1, model="hardware"), other)
    assert [p.name for p in paths] == [f"node-{i:02d}.toml" for i in range(1, 16)]
    for name in [*(p.name for p in paths), "fleet.md"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "node-01.toml").read_bytes() != (other / "node-01.toml").read_bytes()
    # Not the study model's files: another generator, another model.
    study = tmp_path / "study"
    write_fleet(FleetSpec(), study)
    assert (study / "node-01.toml").read_bytes() != (a / "node-01.toml").read_bytes()
    for node, path in zip(hardware_fleet(HARDWARE), paths):
        profile = load_profile(path)
        assert profile.name == node.label and profile.description.startswith(f"hardware {node.label}:")
        assert all(r.persistent and r.schedule.p_enter == 1.0 and r.schedule.p_exit == 0.0 for r in profile.faults)
        assert not any(r.roles for r in profile.faults)  # no scripted destroyer
    table = (a / "fleet.md").read_text(encoding="utf-8")
    assert "hardware model" in table and sum(line.startswith("| node-") for line in table.splitlines()) == 15
    # The footnote: every parameter cited with the figure its source gives (a quote), or labelled the project's choice;
    # the fleet-size figure (Meta's 1 in 1000) drew nothing and is gone.
    for name, value, source in SOURCES:
        assert f"- {name}: {value}. Source: {source}." in table
        assert source.startswith(CHOICE) or ("arXiv" in source and '"' in source), name
    assert "Meta" not in table and "devices of a fleet" not in table


def test_the_model_is_chosen_by_name() -> None:
    assert MODELS == ("study", "hardware") and FleetSpec().model == "study"
    assert drawn(FleetSpec()) == fleet(FleetSpec())
    assert drawn(HARDWARE) == hardware_fleet(HARDWARE)
    with pytest.raises(ConfigError, match="fleet model is one of study, hardware, not 'lab'"):
        FleetSpec(model="lab")
    with pytest.raises(ConfigError, match="comes from faults.fleet_files.drawn"):
        fleet(HARDWARE)


def test_each_cited_proportion_holds_over_a_large_fleet(tmp_path: Path) -> None:
    totals: dict[str, float] = {}
    for node in LARGE[:99]:  # the files, rounded to 3 digits and capped, say what the model says
        calls = calls_by_outcome(loaded(node, tmp_path))
        assert math.isclose(sum(calls.values()), node.rate, rel_tol=0.01), node.label
        for k, v in calls.items():
            totals[k] = totals.get(k, 0.0) + v
    total = sum(totals.values())
    # Anatomy of SDC: NaN/+-Inf about 1.01 % of outcomes (within 0.05 points); single-bit flips under 40 % of flips.
    assert abs(totals["non-finite"] / total - NAN_INF_SHARE) < 5e-4
    single = totals["single-bit"] / (totals["single-bit"] + totals["multi-bit"])
    assert abs(single - SINGLE_BIT_SHARE) < 0.005 and single < 0.40
    # The drawn parameters, over 495 nodes: each share within 4.5 standard errors of its value.
    n = len(LARGE)
    for share, expected in (
        (sum(x.periodic for x in LARGE) / n, 0.5),
        (sum(x.location == "matmul" for x in LARGE) / n, TENSOR_CORE_SHARE),
    ):
        assert abs(share - expected) < 4.5 * math.sqrt(expected * (1 - expected) / n), share
    # Rates log-uniform over RATE: the mean log-rate within 4.5 standard errors of the middle.
    lo, hi = (math.log(x) for x in RATE)
    logs = [math.log(x.rate) for x in LARGE]
    assert lo <= min(logs) and max(logs) <= hi + 0.01
    assert abs(statistics.fmean(logs) - (lo + hi) / 2) < 4.5 * (hi - lo) / math.sqrt(12 * n)


def test_multi_bit_and_warp_periodic_hits_under_the_emulator(write_profile) -> None:
    profile = write_profile(
        '[[fault]]\nops = ["matmul"]\nelements = 3\nstride = 32\nkind = "bitflip"\nbits = "random"\nflips = [2, 4]\n'
    )
    model = nn.Linear(16, 128)
    faults: list[dict] = []
    with FaultEmulator(profile, model, clock=lambda: (0, 0), sink=lambda kind, f: faults.append(f)):
        for _ in range(20):
            model(torch.randn(2, 16))
    assert len(faults) == 20
    for f in faults:
        first = f["index"][0]
        assert f["index"] == [first, first + 32, first + 64] and first < 32
        sets = f["detail"]["bits"]
        assert len(sets) == 3 and all(2 <= len(set(s)) == len(s) <= 4 for s in sets)
        for o, c, s in zip(f["original"], f["corrupted"], sets):
            o_bits, c_bits = (torch.tensor([v], dtype=torch.float32).view(torch.int32).item() for v in (o, c))
            assert bin((o_bits ^ c_bits) & 0xFFFFFFFF).count("1") == len(s)


def test_a_pattern_that_makes_no_sense_is_an_error(write_profile) -> None:
    with pytest.raises(ConfigError, match="flips = 2 needs bits to name a field"):
        write_profile('[[fault]]\nops = ["matmul"]\nkind = "bitflip"\nbits = 3\nflips = 2\n')
    with pytest.raises(ConfigError, match='flips applies only to kind = "bitflip"'):
        write_profile('[[fault]]\nops = ["matmul"]\nkind = "stuck"\nvalue = 0.0\nflips = 2\n')
    with pytest.raises(ConfigError, match="stride"):
        write_profile('[[fault]]\nops = ["matmul"]\nkind = "stuck"\nvalue = 0.0\nstride = 0\n')


def test_a_hardware_node_runs_under_the_emulator_on_the_reference_model(tmp_path: Path) -> None:
    """The busiest periodic matmul node of a large fleet, recorded on the small reference model: its faults are
    its profile's (bit flips of 1 or 2-4 bits, or NaN/Inf, 4 elements 32 apart)."""
    node = max((x for x in LARGE if x.location == "matmul" and x.periodic), key=lambda x: x.rate)
    out = tmp_path / "node"
    record_run(
        small_config("run.steps=6"), out, node_label=node.label, fault_profile=loaded(node, tmp_path), progress=False
    )
    faults = [f.fields for f in events(out, "fault")]
    assert faults
    assert any(len(f["index"]) == PERIODIC_ELEMENTS for f in faults)  # fewer only where a result is short
    for f in faults:
        index = f["index"]
        assert 1 <= len(index) <= PERIODIC_ELEMENTS and index[0] < WARP
        assert all(b - a == WARP for a, b in zip(index, index[1:]))
        if f["kind"] == "bitflip":
            bits = f["detail"]["bits"]
            assert all(isinstance(b, int) for b in bits) or all(
                MULTI_BIT_FLIPS[0] <= len(b) <= MULTI_BIT_FLIPS[1] for b in bits
            )
        else:
            value = f["detail"]["value"]
            assert f["kind"] == "stuck" and (math.isnan(value) or value in (math.inf, -math.inf))


def test_sdc_faults_fleet_writes_the_hardware_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet"
    assert main(["faults", "fleet", "--model", "hardware", "--nodes", "3", "--seed", "4", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    nodes = hardware_fleet(FleetSpec(nodes=3, seed=4, model="hardware"))
    assert lines == [f"{out / f'node-{i:02d}.toml'}  {node.line}" for i, node in enumerate(nodes, 1)]
    assert (out / "node-02.toml").read_text(encoding="utf-8") == nodes[1].text
    with pytest.raises(SystemExit):
        main(["faults", "fleet", "--model", "lab", "--out", str(tmp_path / "x")])
