"""The nondeterminism audit (`sdc verify-determinism --report`) and `sdc diff --tolerance`, on real runs.

A deliberately nondeterministic model (`RandomOrder`: its ``mix`` site sums each row in an order drawn anew in
every recording, as a nondeterministic kernel would) recorded twice: the audit lists ``mix`` with its ulp band; the
diff of the two runs with the map reports no difference, and a 1-exponent-bit fault at that site (the emulator) still
is the first divergence.
A bit-changing setting that differs (NCCL_ALGO on a CPU run) is named, with both values, by pairing. An HF
LlamaForCausalLM recorded twice audits as deterministic.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch
from torch import nn

from faults import load_profile
from sdc.cli import main
from tests.faults.support import train_mlp
from tests.support import SMALL
from tracer.log import LogReader, rank_dir
from tracer.log.records import TensorRecord
from tracer.options import CapturePolicy
from tracer.pairing import pairing_differences, setting_warnings

STEPS, FAULT_STEP = 6, 2
SITES = "mix|out"
EXPONENT_27 = """
description = "bit 27 (an exponent bit) of one element of mix.proj's forward matmul at step 2"
seed = 3
[[fault]]
ops = ["matmul"]
sites = "mix\\\\.proj"
phases = ["forward"]
steps = [2]
elements = 1
kind = "bitflip"
bits = 27
"""


class RandomOrderSum(nn.Module):
    """A linear layer, then each row plus its sum, added up feature by feature in an order drawn from
    ``order_seed``: the bits of the sum differ between recordings with other seeds, its value by a few ulps. Seeded,
    not from the clock, so that the test is the same every time: a map measured on one pair can miss a place where
    that pair happened to agree (AdamW's first update is about ±lr whatever the gradient's last bits), and a third
    run with an order of its own then differed there by one ulp, beyond the map (1 run in 10)."""

    def __init__(self, order_seed: int) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.orders = torch.Generator().manual_seed(order_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        order = torch.randperm(h.shape[-1], generator=self.orders).tolist()
        total = h[:, order[0]]
        for i in order[1:]:  # float32 additions one by one (cumsum and sum accumulate in another precision)
            total = total + h[:, i]
        return h + total[:, None]


class RandomOrder(nn.Module):
    def __init__(self, order_seed: int) -> None:
        super().__init__()
        self.mix = RandomOrderSum(order_seed)
        self.out = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(x)))


def record(out: Path, order_seed: int, profile: Path | None = None) -> Path:
    """STEPS steps of `RandomOrder`, every tensor captured, under the emulated ``profile`` if given."""
    train_mlp(
        out,
        load_profile(profile) if profile else None,
        steps=STEPS,
        model_of=functools.partial(RandomOrder, order_seed),
        sites=SITES,
        capture=CapturePolicy(every=1),
    )
    return out


def diff_rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("random-order")
    profile = root / "exponent-27.toml"
    profile.write_text(EXPONENT_27, encoding="utf-8")
    # faulty sums in b's orders: against a it carries the nondeterminism the map measured on (a, b), and the fault
    return {
        "a": record(root / "a", 1),
        "b": record(root / "b", 2),
        "faulty": record(root / "faulty", 2, profile),
        "root": root,
    }


def test_the_audit_lists_the_random_order_site_with_its_ulp_band(runs, capsys) -> None:
    tolerance = runs["root"] / "tolerance.json"
    assert main(["verify-determinism", "--report", str(tolerance), str(runs["a"]), str(runs["b"])]) == 1
    out = capsys.readouterr().out
    doc = json.loads(tolerance.read_text())
    places = {(p["name"], p["phase"]): p for p in doc["places"]}
    mix = places[("mix", "forward")]
    # every step's sum differs, measured in ulps on the captured tensors of both runs: by a few where the sum is
    # large, by more where it nearly cancels (1408 seen, 2026-12-02); far below the 2**20 and more of a flipped
    # exponent bit, and the band, relative, stays small
    assert mix["events"] == STEPS and mix["ulp_events"] == STEPS and 0 < mix["max_ulps"] < 2**16
    assert 0 < mix["band"] < 1e-3 and doc["measured"]["steps"] == list(range(STEPS)) and doc["margin"] == 2.0
    # what it reaches differs too (gradients, parameters), the input batch does not
    assert {("mix.proj.weight", "grad"), ("out.weight", "param"), ("out", "forward")} <= set(places)
    assert not any(phase == "input" for _, phase in places)
    row = next(line for line in out.splitlines() if line.endswith("  mix") and " forward " in line)
    assert row.split()[:3] == ["site", "forward", str(STEPS)] and f"{mix['max_ulps']:,}" in row.split()


def test_a_report_naming_a_directory_is_refused_in_one_line_before_the_audit(runs, capsys) -> None:
    folder = runs["root"] / "maps"
    folder.mkdir()
    assert main(["verify-determinism", "--report", str(folder), str(runs["a"]), str(runs["b"])]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (  # no audit table, no IsADirectoryError after it
        f"sdc: error: --report {folder}: is a directory; name the tolerance map's file, e.g. {folder}/tolerance.json\n"
    )
    assert list(runs["root"].glob("maps*")) == [folder] and not any(folder.iterdir())  # nor a maps.tmp beside it


def test_a_diff_with_the_map_reports_no_difference_yet_still_the_exponent_bit_fault(runs, capsys) -> None:
    tolerance = runs["root"] / "tolerance-diff.json"
    main(["verify-determinism", "--report", str(tolerance), str(runs["a"]), str(runs["b"])])
    db = runs["root"] / "study.duckdb"
    # without the map the random order is SDC at step 0
    assert main(["diff", "--golden", str(runs["a"]), "--suspect", str(runs["b"]), "--db", str(db)]) == 0
    assert diff_rows(db, "SELECT step, name, phase FROM first_divergence") == [(0, "mix", "forward")]
    capsys.readouterr()
    # with it: no difference, every differing event counted apart
    assert (
        main(
            [
                "diff",
                "--golden",
                str(runs["a"]),
                "--suspect",
                str(runs["b"]),
                "--db",
                str(db),
                "--tolerance",
                str(tolerance),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "measured.runs names" in err and "the suspect run itself" in err  # a warning names the map's run
    pid = diff_rows(db, "SELECT pair_id FROM pairs")[0][0]
    assert diff_rows(
        db, f"SELECT count(*) FROM event_diffs WHERE pair_id = '{pid}' AND status NOT IN ('equal', 'within_tolerance')"
    ) == [(0,)]
    assert diff_rows(db, f"SELECT count(*) FROM first_divergence WHERE pair_id = '{pid}'") == [(0,)]
    assert diff_rows(db, f"SELECT sum(differing) FROM divergence_steps WHERE pair_id = '{pid}'") == [(0,)]
    (within,) = diff_rows(db, f"SELECT events, places FROM within_tolerance WHERE pair_id = '{pid}'")
    assert within[0] > 0 and f"{within[0]:,} of them within the tolerance map's band" in out
    assert "0 differ beyond it" in out
    # the exponent bit at step 2 lies far outside mix's band: the first divergence, as without nondeterminism
    assert (
        main(
            [
                "diff",
                "--golden",
                str(runs["a"]),
                "--suspect",
                str(runs["faulty"]),
                "--db",
                str(db),
                "--tolerance",
                str(tolerance),
            ]
        )
        == 0
    )
    faulty = diff_rows(
        db, f"SELECT pair_id FROM pair_nodes JOIN pairs USING (pair_id) WHERE suspect_path = '{runs['faulty']}'"
    )[0][0]
    assert diff_rows(
        db, f"SELECT step, microbatch, name, phase, status FROM first_divergence WHERE pair_id = '{faulty}'"
    ) == [(FAULT_STEP, 0, "mix", "forward", "differ")]
    assert diff_rows(
        db,
        f"SELECT count(*) FROM event_diffs WHERE pair_id = '{faulty}' AND step < {FAULT_STEP} "
        "AND status NOT IN ('equal', 'within_tolerance')",
    ) == [(0,)]


def test_pairing_names_a_bit_changing_setting_that_differs(runs, monkeypatch, capsys) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    ring = record(runs["root"] / "ring", 3)  # orders of its own: the audit finds mix
    golden, other = (LogReader(rank_dir(r, 0)).header for r in (runs["a"], ring))
    assert other.determinism["env"]["NCCL_ALGO"] == "Ring" and golden.determinism["env"]["NCCL_ALGO"] == ""
    # NCCL sums no collective of a one-rank CPU run: a warning naming the setting and both values, no refusal
    (warning,) = setting_warnings(golden, other)
    assert warning.startswith("determinism.env.NCCL_ALGO: '' vs 'Ring' (changes bits only in NCCL collectives")
    assert pairing_differences(golden, other) == []
    assert main(["verify-determinism", "--report", str(runs["root"] / "ring.json"), str(runs["a"]), str(ring)]) == 1
    assert "warning: setting differs: determinism.env.NCCL_ALGO: '' vs 'Ring'" in capsys.readouterr().out
    # MKL's conditional numerical reproducibility mode changes CPU bits: the pair is refused, naming it
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    cbwr = LogReader(rank_dir(record(runs["root"] / "cbwr", 1), 0)).header
    assert any(d.startswith("determinism.env.MKL_CBWR: '' vs 'AVX2'") for d in pairing_differences(golden, cbwr))


@pytest.mark.slow
def test_an_hf_llama_recorded_twice_audits_as_deterministic(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers", reason="install the extras: pip install -e '.[hf]'")
    from tests.integrations import hf_tiny

    a, b = (hf_tiny.record(tmp_path / name, "node", CapturePolicy(every=1)) for name in ("a", "b"))
    tolerance = tmp_path / "tolerance.json"
    capsys.readouterr()  # the Trainer's own lines
    assert main(["verify-determinism", "--report", str(tolerance), str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert " 0 differ at 0 place(s)" in out.splitlines()[0] and "tensor events over 5 steps" in out
    doc = json.loads(tolerance.read_text())
    assert doc["places"] == [] and doc["measured"]["steps"] == list(range(hf_tiny.STEPS))


@pytest.mark.slow
def test_the_reference_workload_recorded_twice_audits_as_deterministic(tmp_path: Path, capsys) -> None:
    """The config mode: two recordings that keep step 1's full tensors (the blob store), audited."""
    args = [a for kv in SMALL if not kv.startswith("run.") for a in ("--set", kv)]
    tolerance = tmp_path / "tolerance.json"
    assert (
        main(
            [
                "verify-determinism",
                "--report",
                str(tolerance),
                "--steps",
                "2",
                "--capture-steps",
                "1",
                "--keep",
                str(tmp_path / "kept"),
                "--quiet",
                *args,
            ]
        )
        == 0
    )
    assert " 0 differ at 0 place(s)" in capsys.readouterr().out
    assert json.loads(tolerance.read_text())["places"] == []
    assert any((tmp_path / "kept" / "a" / "blobs").rglob("*.safetensors"))


@pytest.mark.slow
def test_two_ranks_recorded_twice_audit_rank_by_rank_as_deterministic(tmp_path: Path, capsys) -> None:
    """gloo on CPU, data parallel over 2 ranks: every rank's events compared, none differs."""
    args = [a for kv in SMALL if not kv.startswith("run.") for a in ("--set", kv)]
    tolerance = tmp_path / "tolerance.json"
    assert (
        main(
            [
                "verify-determinism",
                "--report",
                str(tolerance),
                "--steps",
                "2",
                "--capture-steps",
                "1",
                "--nproc",
                "2",
                "--quiet",
                *args,
            ]
        )
        == 0
    )
    assert " 0 differ at 0 place(s)" in capsys.readouterr().out
    assert json.loads(tolerance.read_text())["measured"]["ranks"] == [0, 1]


@pytest.mark.slow
def test_runs_on_other_cpu_kernels_do_not_pair_and_the_header_says_why(tmp_path: Path) -> None:
    # ATen picks its CPU kernels' vector width once per process (the CPU's, or ATEN_CPU_CAPABILITY's); another width
    # sums in another order, as another CPU model does. Recorded as determinism.cpu_capability, it refuses the pair.
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector kernels to compare the scalar ones with")
    sets = [a for kv in SMALL for a in ("--set", kv)]
    recorded = {}
    for name, env in (("native", {}), ("scalar", {"ATEN_CPU_CAPABILITY": "default"})):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sdc.cli",
                "record",
                "--out",
                str(tmp_path / name),
                "--steps",
                "1",
                "--quiet",
                *sets,
            ],
            cwd=Path(__file__).parents[2],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **env},
        )
        assert done.returncode == 0, done.stderr
        recorded[name] = LogReader(rank_dir(tmp_path / name, 0))
    native, scalar = (recorded[n].header for n in ("native", "scalar"))
    assert scalar.determinism["cpu_capability"] == "DEFAULT" != native.determinism["cpu_capability"]
    fingerprints = [
        [r.fingerprint for r in recorded[n].records() if isinstance(r, TensorRecord)] for n in ("native", "scalar")
    ]
    assert len(fingerprints[0]) == len(fingerprints[1]) and fingerprints[0] != fingerprints[1]
    (difference,) = [d for d in pairing_differences(native, scalar) if "cpu_capability" in d]
    assert difference.startswith(
        f"determinism.cpu_capability: {native.determinism['cpu_capability']!r} vs "
        "'DEFAULT' (selects the CPU kernels' vector width"
    )


def test_a_cpu_kernel_width_that_differs_warns_only_where_the_runs_computed_elsewhere() -> None:
    from tracer.bit_settings import setting_differences
    from tracer.log.records import RunHeader

    def header(device: str, capability: str) -> RunHeader:
        return RunHeader(
            schema_version=1,
            run_id="r",
            node_label="n",
            role="train",
            world_size=1,
            rank=0,
            config={},
            config_fingerprint="c",
            seed=0,
            data_order_fingerprint="d",
            fingerprint_algorithm="f",
            versions={},
            device=device,
            determinism={"cpu_capability": capability},
            created_unix=0.0,
            extra={},
        )

    (cpu,) = setting_differences(header("cpu", "AVX512"), header("cpu", "AVX2"))
    (cuda,) = setting_differences(header("cuda:0", "AVX512"), header("cuda:0", "AVX2"))
    assert (cpu.name, cpu.refuses, cuda.refuses) == ("determinism.cpu_capability", True, False)
