"""The diff job's request: its options as ``python -m pipelines.run`` and ``sdc diff`` spell them, and as
the typed `DiffRequest` that `pipelines.run.diff` takes from them (and ``sdc study`` builds directly).

    report = diff_job()(DiffRequest(golden="runs/A", suspect="runs/B", db=Path("study.duckdb")))

Kept apart from `pipelines.run` so that building the ``sdc`` parser does not import Beam:
`pipelines.diff_job.diff_job` imports the job when one runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.tolerance import ToleranceMap, load_tolerance_map, warn_self_measured
from tracer.errors import UsageError

# Each joined batch costs the job about a millisecond whatever its size (packing, unpacking, the join's numpy
# calls, a Parquet part): 256 steps of the benchmark pair (90 records a step) ran 0.2 s faster than 64 in 2 s
# (benchmarks/bench_diff.py). A model with thousands of tensor records a step makes batches of a million records
# and more (tens of MB a side): --steps-per-bucket lowers that.
DEFAULT_STEPS_PER_BUCKET = 256


@dataclass(frozen=True)
class DiffRequest:
    """One diff: which runs, where the tables go, and how the Beam job runs.

    Runs are strings, not paths: on a cluster they are URLs that only Beam's file systems read.
    """

    golden: str  # the healthy run's directory
    suspect: str  # the run checked against it
    db: Path  # the DuckDB study database the tables are loaded into
    replays: tuple[str, ...] = ()  # replay logs of this pair (lockstep: RQ1, parameter sync: RQ2)
    twin: str | None = None  # the golden fine-tune's shuffle-seed twin: the disagreement baseline
    baseline: bool = False  # the suspect is golden's pretraining shuffle-seed twin: the drift baseline (RQ3)
    staging: str | None = None  # an empty directory for the job's Parquet; None: a temporary one beside db
    skip_corrupt: bool = False  # load what is readable and list corrupt records, instead of failing
    steps_per_bucket: int = DEFAULT_STEPS_PER_BUCKET  # steps per joined batch
    tolerance: ToleranceMap | None = None  # places compared within a measured band (sdc diff --tolerance)
    # suspect checkpoint steps left out of the drift: `sdc certify` found they no longer verify (it names them)
    left_out_checkpoints: frozenset[int] = frozenset()
    beam_args: tuple[str, ...] = ()  # Beam pipeline options, passed through untouched (--runner=...)

    def __post_init__(self) -> None:
        """The checks that need no file system: whether --staging is empty is the job's to find (a URL on a
        cluster is read only through Beam's file systems)."""
        if self.steps_per_bucket < 1:
            raise UsageError(f"--steps-per-bucket must be >= 1, got {self.steps_per_bucket}")

    @classmethod
    def from_args(cls, args: argparse.Namespace, beam_args: Sequence[str]) -> DiffRequest:
        """From a parser that `add_arguments` set up, and the arguments it left for Beam. A tolerance map measured
        on the suspect run itself is named in a warning (its bands may hide the fault)."""
        tolerance = load_tolerance_map(args.tolerance) if args.tolerance is not None else None
        if tolerance is not None:
            warn_self_measured(tolerance, args.suspect)
        return cls(
            golden=args.golden,
            suspect=args.suspect,
            db=args.db,
            replays=tuple(args.replay),
            twin=args.twin,
            baseline=args.baseline,
            staging=args.staging,
            skip_corrupt=args.skip_corrupt,
            steps_per_bucket=args.steps_per_bucket,
            tolerance=tolerance,
            beam_args=tuple(beam_args),
        )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--golden", required=True, metavar="RUN", help="the healthy run's directory (local path or URL)")
    p.add_argument("--suspect", required=True, metavar="RUN", help="the run to check against it")
    p.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="RUN",
        help="a replay log of this pair (lockstep: RQ1, parameter sync: RQ2); repeatable",
    )
    p.add_argument(
        "--twin",
        metavar="RUN",
        help="the golden fine-tune's shuffle-seed twin (`sdc finetune --shuffle-seed`): its disagreement "
        "with --golden is the baseline suspect disagreement is compared with",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="the suspect is golden's shuffle-seed twin (golden's config with data.shuffle_seed changed, no "
        "faults; for a fine-tune, finetune.shuffle_seed): a pretraining twin's parameter drift is the baseline "
        "other nodes' drift is read against, and any twin's loss spikes are the spike finding's null",
    )
    p.add_argument("--db", required=True, type=Path, metavar="FILE", help="DuckDB study database to load into")
    p.add_argument(
        "--staging",
        metavar="DIR",
        help="an empty directory (a URL on a cluster) for the job's Parquet; default: a temporary "
        "directory beside --db, removed after loading",
    )
    p.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="load what is readable and list corrupt records in the corruptions table, instead of failing",
    )
    p.add_argument(
        "--steps-per-bucket",
        type=int,
        default=DEFAULT_STEPS_PER_BUCKET,
        metavar="N",
        help=f"steps per joined batch (default {DEFAULT_STEPS_PER_BUCKET}); lower it for very large models",
    )
    p.add_argument(
        "--tolerance",
        type=Path,
        metavar="MAP",
        help="a tolerance map (sdc verify-determinism --report): events at the places it lists whose bits "
        "differ within its band are counted apart as within tolerance, never as SDC; beyond the "
        "band they still differ (docs/incident.md)",
    )
