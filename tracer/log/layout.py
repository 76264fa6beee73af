"""Names inside a run directory, so no other module spells them out.

Everything sdctrace writes in a run directory, and nothing else (`written_by_sdctrace`):

    <run>/rank-00000/000000.sdclog, 000001.sdclog, ...   one log (a directory of segments) per rank
    <run>/checkpoints/step-000010/rank-00000.msgpack     a checkpoint's manifest (renamed in last) ...
    <run>/checkpoints/step-000010/rank-00000.safetensors ... and its tensors (each first written as *.tmp; safetensors
                                                         itself writes through a .tmpXXXXXX file, which a crash leaves)
    <run>/checkpoints/step-000010/dcp/__0_0.distcp      a sharded (DCP) checkpoint: rank 0's shards, safetensors ...
    <run>/checkpoints/step-000010/dcp/rank-00000.msgpack ... and rank 0's manifest (`tracer.checkpoint.sharded`)
    <run>/blobs/3f/3fa4...e1.safetensors                 captured full tensors (first written as *.tmp<pid>)
    <run>/.sdctrace-lock                                 the writer lock (`tracer.log.runlock`)
"""

from __future__ import annotations

import re
from pathlib import Path

from tracer.errors import UsageError

SEGMENT_SUFFIX = ".sdclog"
SEGMENT_GLOB = "rank-*/*" + SEGMENT_SUFFIX  # every segment of every rank, relative to the run
CHECKPOINT_DIR = "checkpoints"
DCP_DIR = "dcp"  # a sharded checkpoint's folder inside its step's
BLOB_DIR = "blobs"
LOCK_FILE = ".sdctrace-lock"
_RANK_DIR = re.compile(r"rank-(\d{5,})")
_SEGMENT = re.compile(r"(\d{6,})" + re.escape(SEGMENT_SUFFIX))


def rank_dir(run: Path, rank: int) -> Path:
    """The directory holding rank `rank`'s log."""
    return Path(run) / rank_dir_name(rank)


def rank_dir_name(rank: int) -> str:
    """Name of rank `rank`'s log directory inside its run."""
    if rank < 0:
        raise UsageError(f"rank must be >= 0, got {rank}")
    return f"rank-{rank:05d}"


def list_ranks(run: Path) -> list[int]:
    """Ranks that have a log directory in `run`, ascending; [] if `run` is not a directory."""
    run = Path(run)
    if not run.is_dir():
        return []
    return sorted(int(m[1]) for p in run.iterdir() if (m := _RANK_DIR.fullmatch(p.name)) and p.is_dir())


def segment_path(directory: Path, index: int) -> Path:
    return Path(directory) / segment_name(index)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(index, path) of every segment file in a rank directory, in log order."""
    found = ((m, p) for p in Path(directory).iterdir() if (m := _SEGMENT.fullmatch(p.name)))
    return sorted((int(m[1]), p) for m, p in found)


def parse_segment_path(path: str) -> tuple[int, int] | None:
    """(rank, segment index) of a ``.../rank-NNNNN/NNNNNN.sdclog`` path or URL; None for any other file."""
    parts = path.replace("\\", "/").rstrip("/").split("/")
    if len(parts) < 2:
        return None
    rank, segment = _RANK_DIR.fullmatch(parts[-2]), _SEGMENT.fullmatch(parts[-1])
    return (int(rank[1]), int(segment[1])) if rank and segment else None


def segment_name(index: int) -> str:
    """File name of segment `index` inside its rank directory."""
    return f"{index:06d}{SEGMENT_SUFFIX}"


# Each tree sdctrace writes, as the pattern of every level below the run: the last level's are files.
_WRITTEN = (
    (_RANK_DIR, _SEGMENT),
    (
        re.compile(CHECKPOINT_DIR),
        re.compile(r"step-\d{6,}"),
        re.compile(r"rank-\d{5,}\.(msgpack|safetensors)(\.tmp)?|\.tmp[0-9A-Za-z]{6}"),
    ),
    (
        re.compile(CHECKPOINT_DIR),
        re.compile(r"step-\d{6,}"),
        re.compile(DCP_DIR),
        re.compile(r"rank-\d{5,}\.msgpack(\.tmp)?|__\d+_\d+\.distcp"),
    ),
    (re.compile(BLOB_DIR), re.compile(r"[0-9a-f]{2}"), re.compile(r"[0-9a-f]{16}\.(safetensors|tmp\d+)")),
    (re.compile(re.escape(LOCK_FILE)),),
)


def written_by_sdctrace(parts: tuple[str, ...], is_dir: bool) -> bool:
    """Whether ``<run>/<parts...>`` (a directory if ``is_dir``) is a name sdctrace writes in a run directory."""
    for levels in _WRITTEN:
        if 0 < len(parts) <= len(levels) and all(p.fullmatch(x) for p, x in zip(levels, parts, strict=False)):
            return is_dir == (len(parts) < len(levels))
    return False
