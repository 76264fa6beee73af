"""The one way to claim a folder for writing, so that no command destroys data it was not asked to.

    with claim_out_dir(out, role="replay", overwrite=args.overwrite, inputs=(golden, suspect)):
        ...write the run...
    with claim_folder(out, STUDY_FOLDER, overwrite=args.overwrite):    # any other folder sdctrace writes
        ...write the study...

A `FolderKind` says which names a kind of folder holds (a run's are `layout.written_by_sdctrace`;
a study's, a report's are defined by the package that writes them); every folder sdctrace
writes is claimed here, by the same rules.

Before anything is deleted it refuses an ``out`` that is, holds or lies inside one of
the command's inputs, one that holds anything sdctrace does not write there
(the kind's ``written``), and, for runs, one that holds another kind of run (the header's
role: a recording, a replay log, a fine-tune). It then takes the writer lock
(`RunLock`), so a second writer, with or without ``--overwrite``, is refused, and
only then replaces an old run of the same kind, file by sdctrace file, keeping the lock.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracer.errors import LogError, UsageError
from tracer.log.layout import LOCK_FILE, list_ranks, list_segments, rank_dir, written_by_sdctrace
from tracer.log.reader import LogReader
from tracer.log.runlock import RunLock

NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits, in bytes, on one name in a path and on a whole path
_KINDS = {"train": "a recording", "replay": "a replay log", "finetune": "a fine-tune"}


@dataclass(frozen=True)
class FolderKind:
    """A kind of folder sdctrace writes: what it is called and which names in it are sdctrace's."""

    noun: str  # "run", "study", "report": in "cannot create the run directory", "already holds a run"
    written: Callable[[tuple[str, ...], bool], bool]  # (relative path parts, is a directory) -> written by sdctrace
    again: str = "pass --overwrite to replace it or choose another --out"  # how to go on when it holds one


RUN_FOLDER = FolderKind("run", written_by_sdctrace)


@dataclass(frozen=True)
class RunContents:
    """What a directory holds, sorted into what sdctrace wrote there and what it did not."""

    entries: tuple[str, ...]  # sdctrace's top-level entries, the lock file aside
    files: int  # sdctrace's files below them: the data an overwrite deletes
    foreign: tuple[str, ...]  # relative paths sdctrace did not write (not descended into)

    @classmethod
    def scan(cls, out: Path, kind: FolderKind = RUN_FOLDER) -> RunContents:
        entries, foreign, files = [], [], 0
        stack: list[tuple[Path, tuple[str, ...]]] = [(out, ())]
        while stack:
            folder, parts = stack.pop()
            for p in sorted(folder.iterdir()):
                rel = (*parts, p.name)
                is_dir = p.is_dir() and not p.is_symlink()
                if p.is_symlink() or not kind.written(rel, is_dir):
                    foreign.append("/".join(rel) + ("/" if is_dir else ""))
                elif is_dir:
                    stack.append((p, rel))
                elif rel != (LOCK_FILE,):
                    files += 1
                if not parts and rel != (LOCK_FILE,) and kind.written(rel, is_dir):
                    entries.append(p.name)
        return cls(tuple(entries), files, tuple(sorted(foreign)))


def claim_out_dir(out: Path, *, role: str, overwrite: bool, inputs: Sequence[Path | None] = ()) -> RunLock:
    """Make ``out`` ready for a new run of ``role`` and lock it; the caller holds the lock while it writes.

    With ``overwrite`` an old run of the same role in ``out`` is deleted; without, it is refused, unless it is
    what a writer killed during start-up leaves (`startup_leftover`): replaced, as nothing in it can be read.
    """
    claimed = startup_leftover(Path(out))  # looked at before this claim's lock file is made
    return claim_folder(
        out,
        RUN_FOLDER,
        overwrite=overwrite,
        inputs=inputs,
        check=lambda: _refuse_other_kind(Path(out), role, claimed),
    )


def startup_leftover(out: Path) -> bool:
    """Whether ``out`` is what an sdctrace writer killed during start-up leaves: its claim (the lock file) and
    perhaps the checkpoint of step 0, but no log segment on any rank (the header goes out with the first step).
    Nothing in it can be resumed or read, so recording there again loses nothing. A path that cannot be looked at
    (too long a name, no permission): False, and the claim says why."""
    try:
        return (
            out.is_dir()
            and (out / LOCK_FILE).is_file()
            and not any(list_segments(rank_dir(out, rank)) for rank in list_ranks(out))
        )
    except OSError:
        return False


def claim_folder(
    out: Path,
    kind: FolderKind,
    *,
    overwrite: bool,
    inputs: Sequence[Path | None] = (),
    check: Callable[[], bool | None] | None = None,
) -> RunLock:
    """Make ``out`` ready for a new folder of ``kind`` and lock it; the caller holds the lock while it writes.

    With ``overwrite`` what sdctrace wrote in ``out`` is deleted (after ``check``, which may refuse); without,
    it is refused, unless ``check`` says it may go (returns True). A file sdctrace did not write is never deleted:
    it is named, and nothing is deleted.
    """
    out = Path(out)
    refuse_long_names(out, "--out")
    _refuse_inputs(out, [Path(i) for i in inputs if i is not None])
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory; choose another --out")
    if out.is_dir():
        _refuse_foreign(out, _scan(out, kind))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{out}: cannot create the {kind.noun} directory ({_why(out, exc)}); choose another --out"
        ) from exc
    lock = RunLock.acquire(out)
    try:
        found = _scan(out, kind)  # again, now that no other sdctrace process can change it
        _refuse_foreign(out, found)
        if found.files:
            replaceable = check() if check is not None else False
            if not overwrite and not replaceable:
                raise UsageError(f"{out}: already holds a {kind.noun}; {kind.again}")
        for name in found.entries:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    except BaseException:
        lock.release()
        raise
    return lock


def reclaim_folder(out: Path, kind: FolderKind, *, missing: str) -> RunLock:
    """Lock ``out``, a folder of ``kind``, to continue it (a resume); deletes nothing. ``missing``: the error's
    fix when there is no such folder."""
    out = Path(out)
    refuse_long_names(out, "--out")
    if not out.is_dir():
        raise UsageError(f"{out}: no {kind.noun} to resume there; {missing}")
    lock = RunLock.acquire(out)
    try:
        _refuse_foreign(out, _scan(out, kind))
    except BaseException:
        lock.release()
        raise
    return lock


def reclaim_out_dir(out: Path, *, role: str) -> RunLock:
    """Lock ``out``, which must hold a run of ``role``, to continue it (``sdc record --resume``); deletes nothing."""
    lock = reclaim_folder(out, RUN_FOLDER, missing="record one without --resume")
    try:
        _refuse_other_kind(Path(out), role)
    except BaseException:
        lock.release()
        raise
    return lock


def refuse_long_names(path: Path, option: str) -> None:
    """Refuse, in one line, a path the file system cannot name: a part over NAME_MAX bytes, or over PATH_MAX."""
    parts = [p.encode("utf-8", "surrogateescape") for p in Path(path).parts]
    too_long = next((p for p in parts if len(p) > NAME_MAX), None)
    if too_long is not None or len(os.fsencode(path)) >= PATH_MAX:
        what = (
            f"a name of {len(too_long)} bytes in it (at most {NAME_MAX})"
            if too_long is not None
            else f"{len(os.fsencode(path))} bytes long (at most {PATH_MAX - 1})"
        )
        shown = str(path) if len(str(path)) <= 80 else f"{str(path)[:40]}..."
        raise UsageError(f"{option} {shown}: {what}; choose a shorter {option}")


def _refuse_inputs(out: Path, inputs: list[Path]) -> None:
    target = out.resolve()
    for given in inputs:
        source = given.resolve()
        if target == source:
            how = "is"
        elif source in target.parents:
            how = "lies inside"
        elif target in source.parents:
            how = "holds"
        else:
            continue
        raise UsageError(
            f"--out {out} {how} the input run {given}, which this command reads; "
            "nothing was deleted: choose another --out"
        )


def _scan(out: Path, kind: FolderKind = RUN_FOLDER) -> RunContents:
    try:
        return RunContents.scan(out, kind)
    except OSError as exc:
        raise UsageError(f"{out}: cannot list what it holds ({_why(out, exc)}); choose another --out") from exc


def _refuse_foreign(out: Path, found: RunContents) -> None:
    if found.foreign:
        more = f" and {len(found.foreign) - 1} more" if len(found.foreign) > 1 else ""
        raise UsageError(
            f"{out}: holds {found.foreign[0]}{more}, which sdctrace did not write; nothing was deleted: "
            "move it away or choose another --out"
        )


def _refuse_other_kind(out: Path, role: str, leftover: bool = False) -> bool:
    """Refuse ``out`` when it holds a run of another role, or data no log says anything of; True where it is a
    start-up leftover (``leftover``, `startup_leftover`), which may be replaced without --overwrite."""
    for rank in list_ranks(out):
        if not list_segments(rank_dir(out, rank)):
            continue
        try:
            found = LogReader(rank_dir(out, rank)).header.role
        except LogError as exc:
            raise UsageError(
                f"{out}: holds a run whose header cannot be read ({exc}); nothing was deleted: "
                "delete it yourself or choose another --out"
            ) from exc
        if found != role:
            raise UsageError(
                f"{out}: holds {_kind(found)}, and this command writes {_kind(role)}; "
                "nothing was deleted: choose another --out"
            )
        return False
    if leftover:
        return True
    raise UsageError(
        f"{out}: holds checkpoints or blobs but no log that says which kind of run they belong to; "
        "nothing was deleted: delete them yourself or choose another --out"
    )


def _kind(role: str) -> str:
    return _KINDS.get(role, f"a {role!r} run")


def _why(out: Path, exc: OSError) -> str:
    """The cause of a failed write under ``out``, in words: a file in the way, or permission."""
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            return f"{parent} is a file, not a directory"
    if isinstance(exc, PermissionError) or not os.access(_existing(out), os.W_OK):
        return f"no permission to write in {_existing(out)}"
    return exc.strerror or str(exc)


def _existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())
