"""A full file system (or a file size limit) recognised in whatever a write raised, as one line.

    try:
        ...write Parquet, load DuckDB...
    except Exception as exc:
        if (reason := full_disk_reason(exc)) is None:
            raise
        raise StorageError(f"... {reason} ...") from None

The diff's stages ask it, a Tracer closing after a failure asks it (a recording that ran out of space stays
resumable, `tracer.rank_log`), and `tracer.errors.sdc_error_of` makes any command's full disk one line.

Python's writes raise OSError with errno ENOSPC, EFBIG (past RLIMIT_FSIZE, with SIGXFSZ ignored) or
EDQUOT; Beam's runners re-raise a worker's error as their own exception, and DuckDB reports it as text
("Could not write file ...: No space left on device"), so the reason is looked for along the exception's
chain and in its text.
"""

from __future__ import annotations

import errno
import os

FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_TEXTS = tuple(os.strerror(code) for code in FULL)  # "No space left on device", "File too large", "Disk quota exceeded"


def full_disk_reason(exc: BaseException) -> str | None:
    """The operating system's words when ``exc`` (or an error it was raised from or during) is a full file system
    or a file size limit; None for anything else."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL:
            return os.strerror(e.errno)
        text = str(e)
        for words in _TEXTS:
            if words in text:
                return words
        todo += [e.__cause__, e.__context__]
    return None
