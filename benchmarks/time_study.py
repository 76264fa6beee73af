"""Wall time of a whole shipped study, run as the user runs it: one `sdc` process into a temporary folder.

    .venv/bin/python benchmarks/time_study.py                      # demo, then fleet-mini
    .venv/bin/python benchmarks/time_study.py demo --repeat 3      # mean wall time with its 95 % interval
    .venv/bin/python benchmarks/time_study.py fleet                # the longest study: only when asked for

`demo` runs ``sdc demo --out DIR --quiet`` and any other name ``sdc study NAME --out DIR --quiet`` (the shipped
studies in sdc/study/studies/), each in a fresh temporary folder that is removed afterwards, from the `sdc`
process's start to its exit: imports, every job, the report, everything the user waits for. Before each run
the machine-load line (`timing.machine_load`): a wall time measured while another job runs is not the
study's. With ``--repeat N`` (N >= 2) the mean wall time is printed with its bootstrap 95 % interval
(`intervals.mean_interval`). No target: docs/study.md quotes these times so that a user knows how long to wait.

Not part of `make bench` (benchmarks/run.py): each study runs for minutes, the fleet study far longer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from intervals import mean_interval
from timing import machine_load, process_seconds

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "sdc" / "study" / "studies"
DEFAULT = ("demo", "fleet-mini")


def shipped() -> list[str]:
    return sorted(p.stem for p in STUDIES.glob("*.toml"))


def command(study: str, out: Path) -> list[str]:
    """The `sdc` command line for ``study``, as a whole process of this interpreter (run from the checkout's root,
    so that it is this checkout's `sdc`)."""
    args = ["demo"] if study == "demo" else ["study", study]
    return [sys.executable, "-m", "sdc.cli", *args, "--out", str(out), "--quiet"]


def timed_run(study: str) -> float:
    """Seconds from the `sdc` process's start to its exit; stops the script when the study fails."""
    with tempfile.TemporaryDirectory(prefix=f"time-study-{study}-") as tmp:
        try:
            return process_seconds(command(study, Path(tmp) / study), cwd=ROOT)
        except RuntimeError as failed:
            raise SystemExit(f"{study} failed: {failed}") from None


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{seconds:.1f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "studies",
        nargs="*",
        metavar="STUDY",
        default=list(DEFAULT),
        help=f"shipped studies to time (default: {' '.join(DEFAULT)}; one of: {', '.join(shipped())})",
    )
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="runs of each study (default 1)")
    args = p.parse_args()
    unknown = sorted(set(args.studies) - set(shipped()))
    if unknown or args.repeat < 1:
        p.error(f"unknown study {', '.join(unknown)}" if unknown else "--repeat must be at least 1")
    for study in args.studies:
        runs = []
        for i in range(args.repeat):
            print(machine_load(), flush=True)
            runs.append(timed_run(study))
            label = f"{study} (run {i + 1} of {args.repeat})" if args.repeat > 1 else study
            print(
                f"{label:<19}: wall time {minutes(runs[-1])} ({runs[-1]:.1f} s), "
                f"`sdc {' '.join(command(study, Path('DIR'))[3:])}` as one process",
                flush=True,
            )
        if len(runs) >= 2:
            print(f"{study:<19}: mean wall time {mean_interval(runs).describe(unit=' s')}", flush=True)


if __name__ == "__main__":
    main()
