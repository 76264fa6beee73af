"""Names inside a run directory, so no other module spells them out, and the one way to claim one.

    <run>/rank-00000/000000.sdclog, 000001.sdclog, ...   one log (a directory of segments) per rank
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tracer.errors import UsageError

SEGMENT_SUFFIX = ".sdclog"
SEGMENT_GLOB = "rank-*/*" + SEGMENT_SUFFIX  # every segment of every rank, relative to the run
CHECKPOINT_DIR = "checkpoints"
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


def prepare_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse to mix two runs in one directory; with ``overwrite``, replace an old run."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory; choose another --out")
    if not out.exists() or not any(out.iterdir()):
        return
    if not list_ranks(out) and not (out / CHECKPOINT_DIR).exists():
        raise UsageError(f"{out}: directory is not empty and holds no sdctrace run; choose another --out")
    if not overwrite:
        raise UsageError(f"{out}: already holds a run; pass --overwrite to replace it or choose another --out")
    shutil.rmtree(out)
