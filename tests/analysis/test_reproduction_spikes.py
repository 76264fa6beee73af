"""Row 12 (loss spikes) on a small study database: the scripted destroyer alone cannot pass it, the healthy twins are
its null.

The database holds what a fleet study's rq3 loads (runs with their recorded fault profiles, pairs, loss spikes and
fault events), built here row by row; the real `rq3_loss_spikes` query reads it and the real rule judges it. The
destroyer's profile is the fleet generator's own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest

from analysis.load import ensure_schema
from analysis.queries import LIBRARY
from analysis.reproduction_rules import Verdict, spikes
from faults import load_profile
from faults.fleet import DESTROY_STEP, FleetSpec, fleet

TWINS = ["golden-twin", "golden-twin-2", "golden-twin-3", "golden-twin-4", "golden-twin-5"]
STEPS = 100  # fine-tune steps, as on the destroyer-only fleet-mini of issue 45


class Study:
    """A study database under construction: runs, pairs, spikes and faults."""

    def __init__(self, path: Path, tmp: Path) -> None:
        self.path, self.tmp = path, tmp
        self.con = duckdb.connect(str(path))
        ensure_schema(self.con)
        self.runs = 0

    def run(self, label: str, role: str, profile_text: str | None = None) -> str:
        self.runs += 1
        run_id = f"run-{self.runs}"
        extra: dict[str, object] = {}
        if profile_text is not None:
            file = self.tmp / f"{label}-{role}.toml"
            file.write_text(profile_text, encoding="utf-8")
            extra["fault_profile"] = load_profile(file).header(5)
        self.con.execute(
            "INSERT INTO runs (run_id, rank, path, node_label, role, extra) VALUES (?, 0, ?, ?, ?, ?)",
            [run_id, f"/runs/{run_id}", label, role, json.dumps(extra, sort_keys=True, default=repr)],
        )
        return run_id

    def pair(self, golden: str, suspect: str, *, baseline: bool = False) -> str:
        pair_id = f"pair-{golden}-{suspect}"
        self.con.execute(
            "INSERT INTO pairs (pair_id, golden_path, suspect_path, golden_run_id, suspect_run_id, baseline) "
            "VALUES (?, '/g', '/s', ?, ?, ?)",
            [pair_id, golden, suspect, baseline],
        )
        return pair_id

    def spike(self, pair_id: str, step: int, *, side: str = "suspect", ratio: float | None = 3.0) -> None:
        loss = math.nan if ratio is None else 2.0 * ratio
        self.con.execute("INSERT INTO loss_spikes VALUES (?, 0, ?, ?, ?, 2.0, ?)", [pair_id, step, side, loss, ratio])

    def fault(self, pair_id: str, step: int) -> None:
        offset = self.con.execute("SELECT count(*) FROM faults").fetchone()[0]  # type: ignore[index]  # one row
        self.con.execute(
            'INSERT INTO faults (pair_id, side, rank, step, kind, segment, "offset") '
            "VALUES (?, 'suspect', 0, ?, 'bitflip', 0, ?)",
            [pair_id, step, offset],
        )

    def judge(self) -> Verdict:
        self.con.close()
        return spikes(LIBRARY.run(self.path, "rq3_loss_spikes").records())


@pytest.fixture
def destroyer_fleet(tmp_path: Path) -> tuple[Study, dict[str, str]]:
    """Golden, its five fine-tune twins and the pretraining twin, the healthy twin, the generator's destroyer and
    one other fleet node: every pair of a fleet-mini's rq3, no spike yet."""
    nodes = fleet(FleetSpec(nodes=5, seed=1))
    destroyer = next(n for n in nodes if n.destroyer)
    other = next(n for n in nodes if not n.destroyer)
    s = Study(tmp_path / "study.duckdb", tmp_path)
    golden, golden_ft = s.run("golden", "train"), s.run("golden", "finetune")
    pairs = {
        "twin": s.pair(golden, s.run("golden-twin", "train"), baseline=True),
        "destroyer": s.pair(golden, s.run(destroyer.label, "train", destroyer.text)),
        "destroyer-ft": s.pair(golden_ft, s.run(destroyer.label, "finetune", destroyer.text)),
        "other-ft": s.pair(golden_ft, s.run(other.label, "finetune", other.text)),
        "node-00-ft": s.pair(golden_ft, s.run("node-00", "finetune", "seed = 0\n")),
    }
    for twin in TWINS:
        pairs[f"{twin}-ft"] = s.pair(golden_ft, s.run(twin, "finetune"), baseline=True)
    pairs["label"] = destroyer.label
    return s, pairs


def test_a_fleet_where_only_the_scripted_destroyer_spikes_does_not_reproduce_row_12(
    destroyer_fleet: tuple[Study, dict[str, str]],
) -> None:
    s, pairs = destroyer_fleet
    ft = pairs["destroyer-ft"]
    s.fault(ft, DESTROY_STEP)  # the scripted fault ...
    for step in (DESTROY_STEP - 3, DESTROY_STEP + 2, DESTROY_STEP + 20):
        s.fault(ft, step)  # ... and drawn ones around it, which made the old rule count its NaN steps
    for step in range(DESTROY_STEP, STEPS):
        s.spike(ft, step, ratio=None)  # every step after the destroying spike is NaN
    v = s.judge()
    assert v.outcome == "not reproduced", v.ours
    assert v.ours.startswith("0 fleet node(s) spike where golden does not, after a drawn fault")
    assert f"reported apart and not counted: 40 of {pairs['label']} (finetune, from step {DESTROY_STEP})" in v.ours


def test_the_destroyers_fine_tune_script_does_not_excuse_its_pretraining_spikes(
    destroyer_fleet: tuple[Study, dict[str, str]],
) -> None:
    s, pairs = destroyer_fleet
    s.fault(pairs["destroyer"], DESTROY_STEP - 1)  # a drawn fault in pretraining, where the script never fires
    s.spike(pairs["destroyer"], DESTROY_STEP + 1)
    v = s.judge()
    assert v.outcome == "reproduced" and f"after a drawn fault ({pairs['label']})" in v.ours
    assert "reported apart" not in v.ours


@pytest.mark.parametrize("twin", ["golden-twin-3-ft", "twin", "node-00-ft"])
def test_a_healthy_twin_that_spikes_makes_the_finding_not_reproduced(
    destroyer_fleet: tuple[Study, dict[str, str]], twin: str
) -> None:
    s, pairs = destroyer_fleet
    s.fault(pairs["other-ft"], 10)
    s.spike(pairs["other-ft"], 12)  # a fleet spike after a drawn fault: alone, it reproduces the finding ...
    s.spike(pairs[twin], 30)  # ... but a healthy twin spikes where golden does not
    v = s.judge()
    assert v.outcome == "not reproduced" and "healthy twins spike too" in v.ours
    assert "the null, healthy twins diffed against golden: 1 spike(s) golden lacks" in v.ours


def test_a_twin_spike_golden_shares_is_no_null_spike(destroyer_fleet: tuple[Study, dict[str, str]]) -> None:
    s, pairs = destroyer_fleet
    s.fault(pairs["other-ft"], 10)
    s.spike(pairs["other-ft"], 12)
    s.spike(pairs["golden-twin-2-ft"], 30)
    s.spike(pairs["golden-twin-2-ft"], 30, side="golden")  # golden spikes there too: no spike golden lacks
    v = s.judge()
    assert v.outcome == "reproduced" and "0 spike(s) golden lacks" in v.ours
