"""One exception hierarchy for everything a user can cause.

The CLI catches :class:`SdcError` and prints its message on one line, so every
message must say what was expected, what was found, and what to do.
"""

from __future__ import annotations


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


class TraceWarning(UserWarning):
    """Something is recorded less completely than asked (a site with no gradient, microbatches
    logged as one); training goes on."""
