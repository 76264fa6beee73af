"""What every `sdc` command pays before it does anything: `sdc --help` and `sdc query` as whole processes.

    .venv/bin/python benchmarks/bench_startup.py [--runs 10]

Both commands run as the docs tell users to run them: the venv's `sdc` entry point (`python -m sdc.cli` where
no entry point is installed beside the interpreter), one fresh process per run, timed from its start to its exit,
the two commands alternating; this checkout's code first on PYTHONPATH. `sdc query` runs one SELECT on a small
study database written as `sdc diff` writes one (`analysis.load.load_parquet`). Each prints the mean of the runs
with its bootstrap 95 % interval (`intervals.mean_interval`), against the target < 0.5 s (issue 32), met when the
interval's upper end is below it. The first run of each (cold page cache, .pyc files written) is one-time cost,
printed on its own. Beside them, the floor no change to `sdc` goes under: the interpreter alone (`python -c pass`)
and the interpreter with DuckDB, which `sdc query` needs (`python -c "import duckdb"`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
from intervals import mean_interval
from timing import machine_load, process_seconds

from analysis.load import load_parquet
from pipelines.tables import table

TARGET_S = 0.5
ROOT = Path(__file__).resolve().parents[1]
QUERY_SQL = "SELECT count(*) AS steps, max(golden_loss) AS worst FROM loss"


def sdc_command() -> tuple[list[str], str]:
    """How to start `sdc` (the venv's entry point, else `python -m sdc.cli`) and its name for the printout."""
    entry = Path(sys.executable).with_name("sdc")
    if entry.is_file() and os.access(entry, os.X_OK):
        return [str(entry)], str(entry)
    return [sys.executable, "-m", "sdc.cli"], f"{sys.executable} -m sdc.cli"


def checkout_env() -> dict[str, str]:
    """This process's environment with this checkout first on PYTHONPATH, so the timed `sdc` is this code."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def small_study_db(folder: Path, steps: int = 100) -> Path:
    """A study database with one pair and a loss curve of `steps` steps, loaded as `sdc diff` loads one."""
    staging = folder / "staging"
    for name, rows in {
        "pairs": [
            {"golden_path": "golden", "suspect_path": "suspect", "golden_run_id": "run-g", "suspect_run_id": "run-s"}
        ],
        "loss": [
            {"rank": 0, "step": s, "golden_loss": 1.0 / (s + 1), "suspect_loss": 1.0 / (s + 1)} for s in range(steps)
        ],
    }.items():
        (staging / name).mkdir(parents=True)
        pq.write_table(table(name, rows), staging / name / "part.parquet")
    db = folder / "study.duckdb"
    load_parquet(db, staging, "pair")
    return db


def alternate(
    commands: dict[str, Sequence[str]], runs: int, env: dict[str, str]
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each command's first run (one-time cost), then `runs` more of each, the commands taking turns in an order
    rotated every round so none is always first; returns (first run, the other runs) per command."""
    first = {name: process_seconds(argv, env) for name, argv in commands.items()}
    samples: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for i in range(runs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            samples[name].append(process_seconds(commands[name], env))
    return first, samples


def bench_startup(runs: int = 10) -> None:
    print(machine_load(), flush=True)
    sdc, shown = sdc_command()
    env = checkout_env()
    with tempfile.TemporaryDirectory() as tmp:
        db = small_study_db(Path(tmp))
        first, samples = alternate(
            {
                "sdc --help": [*sdc, "--help"],
                "sdc query": [*sdc, "query", "--sql", QUERY_SQL, "--db", str(db)],
                "python -c pass": [sys.executable, "-c", "pass"],
                "python -c 'import duckdb'": [sys.executable, "-c", "import duckdb"],
            },
            runs,
            env,
        )
    print(
        f"sdc startup        : {shown}, {runs} runs of each as whole processes, alternating; "
        f"sdc query: --sql {QUERY_SQL!r} on a 100-step study database"
    )
    for name, values in samples.items():
        target = TARGET_S if name.startswith("sdc") else None
        what = "" if target is not None else " (floor)"
        print(
            f"  {name + what:<33}: {mean_interval(values).describe(target, ' s')}; first run {first[name]:.3f} s "
            "(one-time)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command after its first (default 10)")
    args = parser.parse_args(argv)
    bench_startup(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
