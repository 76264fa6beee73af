"""``sdc certify``: the last checkpoint of a run that can be trusted, to resume from.

    sdc certify runs/suspect --golden runs/golden        # prints runs/suspect/checkpoints/step-000005
    sdc record --out runs/resumed --resume-from "$(sdc certify runs/suspect --golden runs/golden)" ...
    sdc certify runs/ddp                                 # no golden run: the run's replica agreement

With ``--golden`` the pair is diffed as `sdc diff` does (or read from ``--db`` when that database already
holds it) and the named query ``last_clean_checkpoint`` (analysis/QUERIES.md) gives the last checkpoint at
which every record up to it matched golden on every rank. Without it, the run's own replica agreement
(``Guard(replicas=...)``, docs/guard.md) must have held for every step before the checkpoint, on every rank.

Files, not a database, have the last word: every checkpoint of RUN is first read as a resume or a replay reads it
(`tracer.checkpoint.load_checkpoint`: its tensors against its manifest, its model against the parameter
fingerprints the rank's log recorded, so a tensor changed together with its manifest entry is caught too). One that
fails is skipped, with one line naming it, and left out of the diff; a stale ``--db`` that still holds it clean
cannot certify it, and the last clean earlier one is named instead.

Exit status: 0 with the checkpoint's directory on stdout (its step and why on stderr); 1 with a one-line reason
when no checkpoint is clean; 2 when there is nothing to certify against (no --golden, no replicas compared).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdc.commands import Command

EXIT_NONE_CLEAN = 1
EXIT_NOTHING_TO_COMPARE = 2


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Name the last checkpoint of RUN that can be trusted, to resume training from. With --golden: the last "
            "checkpoint (of every rank) at which every record of the steps before it (site outputs and input "
            "gradients, gradients, parameters, inputs, losses) matched the golden run bit for bit, nothing of "
            "those steps was lost to a damaged or missing log segment, and the checkpoint's model equals golden's "
            "(the named query last_clean_checkpoint, over the tables `sdc diff` loads). Every checkpoint is first "
            "checked against its manifest and the fingerprints the run's log recorded, whatever --db says: one that "
            "fails is skipped with one line naming it. Without --golden: the "
            "last checkpoint before which the run's data-parallel replicas agreed at every step (a run recorded "
            "with Guard(replicas=ReplicaAgreement()), docs/guard.md). A checkpoint of step s holds the state "
            "before step s: a fault at step 7 with checkpoints every 5 steps certifies step 5."
        ),
        epilog=(
            "Prints the checkpoint's directory, RUN/checkpoints/step-NNNNNN, alone on stdout, and its step and "
            "what limited it on stderr; exit 0. Exit 1 with a one-line reason when no checkpoint is clean; exit 2 "
            "when there is nothing to certify against (no --golden and no replicas compared). Of the diff's lines only "
            "its warnings are printed. Resume from it: "
            'sdc record --out NEW --resume-from "$(sdc certify RUN --golden G)" (docs/replay.md). The diff runs '
            "on Beam's default runner (use sdc diff with its Beam options, then --db, for another)."
        ),
    )
    p.add_argument("run", metavar="RUN", help="the run directory whose checkpoints to certify")
    p.add_argument("--golden", metavar="G", help="a healthy recording of the same training to compare RUN with")
    p.add_argument(
        "--db",
        type=Path,
        metavar="FILE",
        help="a study database: used as it is when it already holds the pair (`sdc diff --golden G "
        "--suspect RUN`), else the pair is diffed into it; default: a temporary one",
    )
    p.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="diff what is readable (sdc diff --skip-corrupt): a checkpoint after a damaged or missing "
        "part of either log is never certified, one before it can be; default: fail on corruption",
    )
    p.set_defaults(handler=run)


@dataclass(frozen=True)
class Certificate:
    """What certification found: the checkpoint step to resume from (None: none is clean) and why."""

    step: int | None
    reason: str  # what limited it: the first step not known to match, and why


def run(args: argparse.Namespace) -> int:
    from tracer.checkpoint import checkpoint_dir
    from tracer.printable import printable

    damaged = changed_checkpoints(Path(args.run))
    for step, why in sorted(damaged.items()):
        print(printable(f"sdc certify: skipped the checkpoint of step {step}: {why}"), file=sys.stderr)
    cert = against_golden(args, damaged) if args.golden is not None else against_replicas(Path(args.run), damaged)
    if cert is None:
        print(
            printable(
                f"sdc certify: nothing to certify {args.run} against: it compared no replicas (recorded "
                "without Guard(replicas=...) or on one rank); give --golden RUN"
            ),
            file=sys.stderr,
        )
        return EXIT_NOTHING_TO_COMPARE
    if cert.step is None:
        print(printable(f"sdc certify: no clean checkpoint in {args.run}: {cert.reason}"), file=sys.stderr)
        return EXIT_NONE_CLEAN
    print(checkpoint_dir(args.run, cert.step))
    print(printable(f"certified: step {cert.step} of {args.run} ({cert.reason})"), file=sys.stderr)
    return 0


# -- against a golden run ------------------------------------------------------------------------------------------
def changed_checkpoints(run: Path) -> dict[int, str]:
    """Step -> why, for each plain checkpoint of ``run`` that some rank's files no longer verify: read as a resume or
    a replay reads it (`load_checkpoint`: its tensors against its manifest, its model against the fingerprints the
    rank's log recorded), whatever a database says of it. A run that is no local directory: nothing (the diff
    reads its checkpoints)."""
    from tracer.checkpoint import list_checkpoints, load_checkpoint
    from tracer.errors import LogError
    from tracer.log import list_ranks

    found: dict[int, str] = {}
    for rank in list_ranks(run) if run.is_dir() else ():
        for step in list_checkpoints(run, rank):
            if step in found:
                continue
            try:
                load_checkpoint(run, step, rank)
            except (LogError, OSError) as exc:
                found[step] = str(exc)
    return found


def against_golden(args: argparse.Namespace, damaged: Mapping[int, str]) -> Certificate:
    """Diff RUN against --golden (unless --db holds the pair), leaving out the ``damaged`` checkpoints, then the
    pair's `last_clean_checkpoint` rows."""
    from analysis.clean_checkpoints import clean_checkpoint_rows
    from pipelines.arguments import DiffRequest
    from pipelines.diff_job import diff_job

    with tempfile.TemporaryDirectory(prefix="sdc-certify-") as scratch:
        db = args.db if args.db is not None else Path(scratch) / "certify.duckdb"
        pair_id = loaded_pair(db, args.golden, args.run) if db.exists() else None
        if pair_id is None:
            request = DiffRequest(
                golden=args.golden,
                suspect=args.run,
                db=db,
                skip_corrupt=args.skip_corrupt,
                left_out_checkpoints=frozenset(damaged),
            )
            pair_id = diff_job()(request, echo=_warnings_only).pair_id
        rows = clean_checkpoint_rows(db, pair_id)
    return certificate_of(rows, args.golden, damaged)


def _warnings_only(line: str) -> None:
    """The diff's lines that certify passes on: its warnings (corruption skipped, a setting that differs), one line
    each; its progress is left out, so a refusal is the one ``sdc: error:`` line."""
    if line.lstrip().startswith("warning:"):
        print(line.strip(), file=sys.stderr)


def loaded_pair(db: Path, golden: str, suspect: str) -> str | None:
    """The pair_id of the newest pair in ``db`` of these two runs (by their lowest rank's run ids); None: none."""
    from analysis.clean_checkpoints import newest_pair
    from tracer.log import LogReader, list_ranks, rank_dir

    ids = []
    for run in (golden, suspect):
        ranks = list_ranks(Path(run))
        if not ranks:
            return None  # not a local run directory: the diff says what it is
        ids.append(LogReader(rank_dir(Path(run), ranks[0]), on_corruption="skip").header.run_id)
    return newest_pair(db, *ids)


def certificate_of(rows: list[Mapping[str, Any]], golden: str, damaged: Mapping[int, str]) -> Certificate:
    """The run's certificate from its ranks' `last_clean_checkpoint` rows: the last checkpoint clean on every rank
    whose files still verify (not one of ``damaged``, whatever the rows say of it)."""
    if not rows:
        return Certificate(None, f"no rank was compared with {golden}")
    # Ranks limited at the same step: the one the diff says went first (a pipeline stage before those it sent to).
    first = min(rows, key=lambda r: (r["verified_until"], r.get("divergence_order") or 1 << 62, r["rank"]))
    until, what = first["verified_until"], first["limited_by"]
    if what == "divergence":
        why = (
            f"rank {first['rank']} diverged from {golden} at step {until} "
            f"({first['first_name']} {first['first_phase']})"
        )
    elif what == "loss":
        why = f"rank {first['rank']}'s loss differs from {golden}'s at step {until}"
    elif what == "lost":
        why = (
            f"rank {first['rank']}'s steps from {until} on could not be read in one of the runs (a damaged or "
            "missing log segment)"
        )
    else:
        why = f"every record matched {golden} through step {until - 1}, the last step both runs hold"
    clean = set.intersection(*(set(r["clean_checkpoints"] or ()) for r in rows)) - set(damaged)
    if clean:
        return Certificate(max(clean), why)
    held = sorted(set.intersection(*(set(r["checkpoints"] or ()) for r in rows)) - set(damaged))
    if not held:
        return Certificate(None, f"{why}; the two runs hold no common checkpoint that could be read")
    return Certificate(
        None,
        f"{why}, before the first checkpoint that matches golden "
        f"(checkpoints both runs hold: steps {', '.join(map(str, held))})",
    )


# -- against the run's own replicas ----------------------------------------------------------------------------------
def against_replicas(run: Path, damaged: Mapping[int, str]) -> Certificate | None:
    """The last checkpoint every rank holds, not one of ``damaged``, before which every step completed on every rank
    and no ``replicas`` event (a disagreement, docs/guard.md) was logged; None when the run compared no replicas."""
    from tracer.checkpoint import list_step_checkpoints
    from tracer.errors import UsageError
    from tracer.log import LogReader, list_ranks, rank_dir
    from tracer.log.records import EventRecord

    ranks = list_ranks(run)
    if not ranks:
        raise UsageError(f"{run}: not a run directory (no rank-NNNNN logs)")
    readers = {rank: LogReader(rank_dir(run, rank)) for rank in ranks}
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # importing Beam warns about Google Cloud clients (as pipelines.diff_job)
    try:
        from pipelines.alarms import checks_replicas
    finally:
        root.setLevel(level)
    if len(ranks) < 2 or not any(checks_replicas(r.header.extra) for r in readers.values()):
        return None
    prefixes: list[int] = []  # per rank: steps 0..k-1 completed
    disagreed: int | None = None
    detail = ""
    for reader in readers.values():
        done: set[int] = set()
        for rec in reader.records():
            if isinstance(rec, EventRecord) and rec.kind == "step":
                done.add(rec.step)
            elif (
                isinstance(rec, EventRecord) and rec.kind == "replicas" and (disagreed is None or rec.step < disagreed)
            ):
                disagreed, detail = rec.step, str(rec.fields.get("detail", ""))
        prefixes.append(next(k for k in range(len(done) + 1) if k not in done))
    completed = min(prefixes)
    if disagreed is not None and disagreed < completed:
        until, why = disagreed, f"the replicas disagreed at step {disagreed}: {detail}"
    else:
        until, why = (
            completed,
            (f"the replicas agreed at every step through step {completed - 1}, the last every rank completed"),
        )
    held = set.intersection(*(set(list_step_checkpoints(run, rank)) for rank in ranks)) - set(damaged)
    usable = [step for step in held if step <= until]
    if not usable:
        return Certificate(
            None, f"{why}, before the first checkpoint every rank holds ({min(held) if held else 'none'})"
        )
    return Certificate(max(usable), why)
