"""Reading a run's files (segments, checkpoints, blobs) without hanging or reading without bound.

A run folder can hold anything a user (or a broken copy) put there: a FIFO named like a
segment blocks ``open()`` forever, and a symlink to ``/dev/zero`` never ends. sdctrace
therefore reads only *regular files*: symlinks are followed, and the file they resolve
to must be a regular file (anywhere: a run copied with ``cp -s`` still reads). Every
read is bounded by the size ``stat`` reported; a file that grows meanwhile is read up
to that size only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from tracer.bounded_read import FILE_KINDS
from tracer.errors import LogError


def _not_regular(path: str | Path, mode: int, what: str) -> LogError:
    kind = next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")
    via = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return LogError(
        f"{path}: {what} is {kind}{via}, not a regular file; sdctrace reads only regular files: "
        "replace it with the file it stands for or remove it"
    )


def regular_size(path: str | Path, what: str = "file") -> int:
    """The size of ``path`` after following symlinks; LogError unless it is a regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LogError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode, what)
    return st.st_size


def open_regular(path: str | Path, what: str = "file") -> tuple[BinaryIO, int]:
    """(binary file, size as stat'ed) of a regular file; never blocks on a FIFO. The caller closes it."""
    regular_size(path, what)
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not block open(); fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise LogError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise _not_regular(path, st.st_mode, what)
    return f, st.st_size


def read_regular(path: str | Path, what: str = "file") -> bytes:
    """All bytes of a regular file, at most the size it had when stat'ed."""
    f, size = open_regular(path, what)
    with f:
        try:
            return f.read(size)
        except OSError as exc:
            raise LogError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
