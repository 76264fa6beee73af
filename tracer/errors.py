"""One exception hierarchy for everything a user can cause.

The CLI catches :class:`SdcError` and prints its message, one line unless it has line breaks of its own (a
module tree: kept, the later lines indented), so every message must say what was expected, what was found,
and what to do.
"""

from __future__ import annotations

from tracer.full_disk import full_disk_reason


class SdcError(Exception):
    """Root of every error sdctrace raises on purpose."""


class ConfigError(SdcError):
    """A config, profile or option is missing, malformed or names an unknown key."""


class UsageError(SdcError):
    """A command was asked for something it cannot do (e.g. overwrite a run)."""


class CaptureError(SdcError):
    """Tracing failed on the training node (hooks, fingerprints, background writer)."""


class LogError(SdcError):
    """A run directory or event log cannot be read as asked."""


class LogFormatError(LogError):
    """A file is not an sdctrace log, or was written by a newer format version."""


class CheckpointChangedError(LogError):
    """A checkpoint's tensor differs from the fingerprint the log recorded for it: changed after it was written."""


class LogCorruptionError(LogError):
    """A record in the middle of a log fails its length or CRC check."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"{path}: corrupt record at byte {offset}: {reason} "
            "(read with on_corruption='skip' / --skip-corrupt to continue past it)"
        )


class ValidationError(SdcError):
    """Two runs, or a run and a request, do not fit together (pairing, steps, blobs)."""


class StorageError(SdcError):
    """Writing failed: a file system filled up, a file size limit was reached, or a database refused the write.
    What was being written is left out; what was there before is as it was."""


class TraceWarning(UserWarning):
    """Something is recorded less completely than asked (a site with no gradient, microbatches
    logged as one); training goes on."""


class GuardStop(SdcError):
    """The guard stopped training before an optimizer step: a detector fired, and re-running the step
    reproduced it (or could not settle it) under the policy ``on_deterministic="stop"``."""

    exit_code = 3  # `sdc` exits with this status, apart from other errors' 1

    def __init__(self, step: int, outcome: str, alarms: str, checkpoint: str | None) -> None:
        self.step, self.outcome, self.checkpoint = step, outcome, checkpoint
        saved = (
            f"the state before the step is checkpointed in {checkpoint}"
            if checkpoint is not None
            else "no checkpoint (the Tracer writes to a sink, not a run directory)"
        )
        super().__init__(
            f"step {step}: the guard stopped training ({outcome}: {alarms}); {saved}; look at the step's "
            "guard event (sdc inspect), then resume from the checkpoint or take the node out of service"
        )


def sdc_error_of(exc: BaseException) -> SdcError | None:
    """The SdcError behind ``exc``: itself, one that torch.compile's Dynamo re-raised as its own error (an
    sdctrace check that runs while Dynamo compiles, `tracer.compiled`), or a `StorageError` for a write that a full
    file system or a file-size limit stopped (`tracer.full_disk`: the environment, not a bug); None for any other
    exception."""
    if isinstance(exc, SdcError):
        return exc
    if type(exc).__module__.startswith("torch._dynamo") and isinstance(exc.__context__, SdcError):
        return exc.__context__
    reason = full_disk_reason(exc)
    if reason is None:
        return None
    where = next((e.filename for e in _chain(exc) if isinstance(e, OSError) and e.filename), None)
    return StorageError(
        f"{'' if where is None else f'{where}: '}cannot write ({reason}); free space on that file system (or raise "
        "the file-size limit) and run the command again"
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, nearest first."""
    found: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is not None and all(e is not f for f in found):
            found.append(e)
            todo += [e.__cause__, e.__context__]
    return found
