"""Which names in a study, fleet-study and report folder are sdctrace's, so that they are claimed as run folders are.

    with claim_folder(out, STUDY_FOLDER, overwrite=overwrite):   # tracer.log.claim: foreign files refused
        ...run the study...

A study folder holds run folders (``runs/<label>/``, ``replays/<label>-<mode>/``, ``finetune/<label>/``,
each as `tracer.log.layout` names it), its database (with DuckDB's ``.wal`` and ``.tmp/``), a diff's
scratch folders (`pipelines.scratch`), ``report/`` (``index.html`` and ``rq*.png``), ``study.log`` and
``study-state.json`` (with its ``.tmp``). A fleet study's folder holds ``profiles/`` (a second fault
model's in ``profiles/<model>/``), one study folder per experiment (``rq1/`` ...; a second fault model's
``<model>/rq1/`` ...), ``report/``, ``reproduction.md``, the log and the state file. Anything else is
the user's: ``--overwrite`` refuses it, by name, and deletes nothing; so is a ``study.duckdb`` that is not
a database sdctrace wrote (`refuse_foreign_databases`).
"""

from __future__ import annotations

import re
from pathlib import Path

from analysis.study_db import db_written_by_sdctrace
from faults.fleet import MODELS
from pipelines.scratch import SCRATCH_PREFIX
from tracer.errors import UsageError
from tracer.log.claim import FolderKind
from tracer.log.layout import LOCK_FILE, written_by_sdctrace

STATE = "study-state.json"
LOG = "study.log"
DB = "study.duckdb"
REPORT = "report"
RUN_TREES = ("runs", "replays", "finetune")  # each subfolder a run folder
PARTS = ("rq1", "rq2", "rq3")  # a fleet study's experiments, each a study folder
_REPORT_FILE = re.compile(r"index\.html|rq\d[A-Za-z0-9_-]*\.png")
_PROFILE = re.compile(r"[A-Za-z0-9_.-]+\.toml|fleet\.md")
_FILES = (LOCK_FILE, STATE, STATE + ".tmp", LOG)
_STUDY_FILES = (*_FILES, DB, DB + ".wal")


def report_written(parts: tuple[str, ...], is_dir: bool) -> bool:
    """Whether ``<report>/<parts...>`` is a name `analysis.study_report` (or the lock) writes."""
    return len(parts) == 1 and not is_dir and (parts[0] == LOCK_FILE or bool(_REPORT_FILE.fullmatch(parts[0])))


def study_written(parts: tuple[str, ...], is_dir: bool) -> bool:
    """Whether ``<study>/<parts...>`` is a name a study writes."""
    top, rest = parts[0], parts[1:]
    if top in RUN_TREES:
        return is_dir if len(rest) <= 1 else written_by_sdctrace(rest[1:], is_dir)
    if top == REPORT:
        return is_dir if not rest else report_written(rest, is_dir)
    if top == DB + ".tmp" or top.startswith(SCRATCH_PREFIX):  # DuckDB's spill folder, a diff's scratch: all theirs
        return is_dir or bool(rest)
    return not rest and not is_dir and top in _STUDY_FILES


def fleet_written(parts: tuple[str, ...], is_dir: bool) -> bool:
    """Whether ``<fleet study>/<parts...>`` is a name a fleet study writes."""
    top, rest = parts[0], parts[1:]
    if top in PARTS:
        return is_dir if not rest else study_written(rest, is_dir)
    if top in MODELS:  # another fault model's experiments: hardware/rq1/ ...
        return (
            is_dir if not rest else (rest[0] in PARTS and (is_dir if not rest[1:] else study_written(rest[1:], is_dir)))
        )
    if top == "profiles":
        if rest and rest[0] in MODELS:  # another fault model's profiles
            rest = rest[1:]
        return is_dir if not rest else len(rest) == 1 and not is_dir and bool(_PROFILE.fullmatch(rest[0]))
    if top == REPORT:
        return is_dir if not rest else report_written(rest, is_dir)
    return not rest and not is_dir and top in (*_FILES, "reproduction.md")


_AGAIN = "pass --overwrite to replace it, --resume to finish it, or choose another --out"
STUDY_FOLDER = FolderKind("study", study_written, _AGAIN)
FLEET_FOLDER = FolderKind("fleet study", fleet_written, _AGAIN)
REPORT_FOLDER = FolderKind("report", report_written)


def refuse_foreign_databases(out: Path) -> None:
    """Refuse, before an overwrite deletes anything, a study database in ``out`` (or in a fleet study's
    experiments) that sdctrace did not write: one that DuckDB cannot open, or without sdctrace's schema table."""
    fleet = [out / part / DB for part in PARTS] + [out / m / part / DB for m in MODELS for part in PARTS]
    for db in (out / DB, *fleet):
        ours = not db.is_file() or db_written_by_sdctrace(db)
        if not ours:
            raise UsageError(
                f"{db}: is not a study database sdctrace wrote; nothing was deleted: move it away "
                "or choose another --out"
            )
