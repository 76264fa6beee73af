"""``sdc report``: plots and one HTML page from a study database."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from sdc.commands import Command


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Draw the study's plots (mismatch frequency over steps and severity per node, noise-to-signal per "
            "step with the worst case, parameter drift beside both loss curves with spikes marked, fine-tuned "
            "accuracy and disagreement when loaded) and write them with the summary tables to OUT/index.html, "
            "a self-contained page with relative image paths. Every number comes from a named query "
            "(`sdc query --list`), so the report and `sdc query` agree."
        ),
    )
    p.add_argument("--db", required=True, type=Path, metavar="FILE", help="the study database written by `sdc diff`")
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="folder for index.html and the PNGs (created; a folder holding files sdctrace did not write is refused)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a report already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from analysis.study_db import open_read_only
    from analysis.study_report import build_report
    from sdc.study.folders import REPORT_FOLDER
    from tracer.log.claim import claim_folder

    open_read_only(args.db).close()  # a missing or foreign database is refused before --overwrite deletes a report
    created = not os.path.lexists(args.out)
    try:
        with claim_folder(args.out, REPORT_FOLDER, overwrite=args.overwrite):
            report = build_report(args.db, args.out, progress=not args.quiet)
    except BaseException:
        if created:  # a report that could not be written leaves no folder behind (only its lock was in it)
            shutil.rmtree(args.out, ignore_errors=True)
        raise
    missing = sum(len(s.notes) for s in report.sections)
    print(
        f"wrote {report.index} with {len(report.images)} plot(s)"
        + (f"; {missing} part(s) without data, see the notes in the page" if missing else "")
    )
    return 0
