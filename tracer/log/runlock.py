"""The writer lock of a run directory: one writing process (and the ranks it launches) at a time.

    with RunLock.acquire(run):          # refuses at once if another process holds it
        ...write the run...
    launch(..., lock=lock)              # launched ranks inherit it (`inherit`)

The lock is an exclusive ``flock`` on ``<run>/.sdctrace-lock``, so the operating
system releases it when the holder exits or crashes; no stale lock survives a
process. The file itself stays (a lock file that is deleted and re-created could be
held by two processes at once). A process that launches ranks hands them its open
lock (file descriptor and path in ``SDC_RUN_LOCK``): the lock then lasts as long as
any of them runs, and a rank that claims the directory recognises the lock as its
own instead of failing on it. A job started by a user's own ``torchrun`` has no such
parent: there the Tracer of rank 0 takes the lock while it records, as in any script. A process that
already holds a run's lock (it claimed the directory, then traces into it) gets it
again from `ensure`, as a view that leaves the lock to the first holder.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from tracer.errors import UsageError
from tracer.log.layout import LOCK_FILE

ENV = "SDC_RUN_LOCK"  # "<fd>:<lock file>" of a lock a launched rank inherits
_TRIES, _RETRY_S = 5, 0.01
_HELD: dict[Path, int] = {}  # lock file (resolved) -> descriptor of the locks this process acquired and holds


class RunLock:
    """An exclusive lock on a run directory, held until `release` (or the process ends)."""

    def __init__(self, path: Path, fd: int | None, *, owned: bool) -> None:
        self.path = path
        self._fd = fd
        self._owned = owned  # False: inherited from the launcher, which releases it

    @classmethod
    def acquire(cls, run: Path) -> RunLock:
        """Lock ``run`` (an existing directory) for writing; a one-line `UsageError` if another process holds it."""
        path = Path(run) / LOCK_FILE
        fd = _inherited(path)
        if fd is not None:
            return cls(path, fd, owned=False)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UsageError(
                f"{run}: cannot create its lock file {LOCK_FILE} ({exc.strerror}); choose an --out you can write to"
            ) from exc
        if not _flock(fd):
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(
                f"{run}: another process{holder} is writing this run; wait for it to finish, or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD[path.resolve()] = fd
        return cls(path, fd, owned=True)

    @classmethod
    def ensure(cls, run: Path) -> RunLock:
        """`acquire`, except that a lock this process already holds on ``run`` (it claimed the directory before it
        traces into it) is handed back as a view that leaves releasing it to its holder."""
        path = Path(run) / LOCK_FILE
        fd = _HELD.get(path.resolve()) if path.exists() else None
        return cls(path, fd, owned=False) if fd is not None else cls.acquire(run)

    def inherit(self) -> tuple[dict[str, str], tuple[int, ...]]:
        """(environment, file descriptors) that hand this lock to a launched process."""
        if self._fd is None:
            raise UsageError(f"{self.path}: the lock is released; a released lock cannot be handed on")
        return {ENV: f"{self._fd}:{self.path.resolve()}"}, (self._fd,)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and self._owned:
            _HELD.pop(self.path.resolve(), None)
            os.close(fd)  # closing the last descriptor of the open file drops the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _flock(fd: int) -> bool:
    """Take the exclusive lock; False if a writer holds it. A reader that asks whether a writer runs
    (`tracer.log.follow`) holds a shared lock for microseconds: a few retries step past it."""
    for attempt in range(_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _TRIES:
                time.sleep(_RETRY_S)
    return False


def _inherited(path: Path) -> int | None:
    """The descriptor of ``path``'s lock if this process inherited it, held, from its launcher."""
    fd_text, _, locked = os.environ.get(ENV, "").partition(":")
    if not fd_text.isdigit() or not path.exists() or Path(locked) != path.resolve():
        return None
    fd = int(fd_text)
    try:
        same_file = os.path.samestat(os.fstat(fd), os.stat(path))
        if same_file:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds only on the open file that holds it
    except OSError:
        return None
    return fd if same_file else None


def _holder(fd: int) -> str:
    """`` (pid N)`` of the process that wrote the lock file, when it says."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""
