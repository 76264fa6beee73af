"""`sdc certify` trusts the checkpoint files, not a database (issue 48, item 4): on two healthy recordings of the small
workload (4 steps, checkpoints 0, 2 and 4), a last checkpoint damaged after a `--db` certified it, or changed together
with its manifest entry, is skipped with one line naming it, and the checkpoint of step 2 is certified."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import duckdb
import pytest

from jobs.record import record_run
from sdc.cli import main
from tests.support import small_config
from tests.tracer.checkpoint_tamper import tamper_both
from tracer.checkpoint import checkpoint_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("certify-files")
    for name in ("golden", "twin"):
        record_run(small_config(), root / name, node_label=name, progress=False)
    return SimpleNamespace(root=root, golden=root / "golden", twin=root / "twin")


def certify(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, list[str]]:
    """`sdc certify ARGS`: exit status, stdout, and its own lines of stderr (not the diff's progress)."""
    code = main(["certify", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.splitlines() if line.startswith(("certified", "sdc"))]


def test_a_checkpoint_damaged_after_the_database_was_loaded_is_skipped(runs: SimpleNamespace, capsys) -> None:
    run, db = runs.root / "stale", runs.root / "stale.duckdb"
    shutil.copytree(runs.twin, run)
    code, out, _ = certify(capsys, run, "--golden", runs.golden, "--db", db)
    assert code == 0 and out == f"{checkpoint_dir(run, 4)}\n"
    tensors = checkpoint_dir(run, 4) / "rank-00000.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-3] ^= 0x40  # a bit of the last tensor: it no longer matches its manifest
    tensors.write_bytes(bytes(data))
    loaded = db.stat().st_mtime_ns
    code = main(["certify", str(run), "--golden", str(runs.golden), "--db", str(db)])
    captured = capsys.readouterr()
    assert db.stat().st_mtime_ns == loaded  # the database held the pair: no diff ran, the files were read all the same
    assert code == 0 and captured.out == f"{checkpoint_dir(run, 2)}\n"
    skipped, certified = captured.err.strip().splitlines()
    assert skipped.startswith("sdc certify: skipped the checkpoint of step 4: ") and str(tensors.parent) in skipped
    assert certified.startswith(f"certified: step 2 of {run}")


def test_a_checkpoint_changed_with_its_manifest_is_skipped_in_one_line(runs: SimpleNamespace, capsys) -> None:
    run = runs.root / "changed"
    shutil.copytree(runs.twin, run)
    name = tamper_both(run, 4)  # it still passes its own manifest's check; the log's fingerprints catch it
    code, out, err = certify(capsys, run, "--golden", runs.golden)
    assert code == 0 and out == f"{checkpoint_dir(run, 2)}\n", err
    skipped, certified = err
    assert skipped.startswith("sdc certify: skipped the checkpoint of step 4: ") and repr(name) in skipped
    assert "changed after it was written" in skipped and certified.startswith(f"certified: step 2 of {run}")


def test_a_refusal_is_one_line_without_the_diffs_progress(runs: SimpleNamespace, capsys) -> None:
    golden = runs.root / "changed-golden"
    shutil.copytree(runs.golden, golden)
    tamper_both(golden, 2)  # the diff refuses a golden checkpoint its log does not vouch for
    code = main(["certify", str(runs.twin), "--golden", str(golden)])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("sdc: error: ") and "changed after it was written" in line


@pytest.mark.parametrize("damage", ["a table dropped", "cut short"])
def test_a_db_whose_pairs_cannot_be_read_is_refused_in_one_line(runs: SimpleNamespace, capsys, damage: str) -> None:
    whole = runs.root / "whole.duckdb"
    if not whole.exists():
        assert main(["diff", "--golden", str(runs.golden), "--suspect", str(runs.twin), "--db", str(whole)]) == 0
    db = runs.root / f"{damage}.duckdb"
    if damage == "a table dropped":  # sdctrace's schema lets a table be absent: the query then fails
        shutil.copy(whole, db)
        con = duckdb.connect(str(db))
        con.execute("DROP TABLE param_drift")
        con.close()
    else:  # DuckDB opens it and reads its catalog; the pairs' blocks are past its end
        db.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    capsys.readouterr()
    before = db.read_bytes()
    code = main(["certify", str(runs.twin), "--golden", str(runs.golden), "--db", str(db)])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == "" and db.read_bytes() == before
    [line] = captured.err.splitlines()
    assert line.startswith(f"sdc: error: --db {db}: its pairs could not be read (") and "a new path" in line, line
