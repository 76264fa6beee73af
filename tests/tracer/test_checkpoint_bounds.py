"""Checkpoint manifests are bounded (issue 31, case 10): nesting anywhere in them, with the reason in the message,
and their size before a byte is read (a 2 GB sparse manifest is refused in little memory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch

from tracer.checkpoint import checkpoint_dir, load_checkpoint, save_checkpoint
from tracer.checkpoint.dcp_manifest import parse_manifest
from tracer.checkpoint.manifest_bounds import MANIFEST_BASE_BYTES, manifest_limit
from tracer.errors import LogError

ROOT = Path(__file__).resolve().parents[2]


def nested(depth: int) -> bytes:
    """msgpack of ``depth`` maps, each inside the last ({"a": {"a": ... nil}})."""
    return b"\x81\xa1a" * depth + b"\xc0"


def saved(run: Path) -> Path:
    """A real checkpoint of step 1 of a small model after one Adam step; its manifest's path."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).square().sum().backward()
    optimizer.step()
    save_checkpoint(run, 1, 0, model, optimizer, {"step": 1})
    return checkpoint_dir(run, 1) / "rank-00000.msgpack"


def with_nested(manifest: Path, where: tuple[str, ...], depth: int) -> None:
    """Put ``depth`` nested maps at ``where`` in the manifest, as bytes (msgpack's packer refuses to nest so deep)."""
    m = msgpack.unpackb(manifest.read_bytes(), raw=False, strict_map_key=False)
    target = m
    for key in where[:-1]:
        target = target.setdefault(key, {})
    target[where[-1]] = "NESTED-HERE"
    raw = msgpack.packb(m, use_bin_type=True)
    manifest.write_bytes(raw.replace(msgpack.packb("NESTED-HERE"), nested(depth)))


def test_maps_nested_inside_the_optimizer_state_are_refused_naming_the_field(tmp_path: Path) -> None:
    manifest = saved(tmp_path / "run")
    with_nested(manifest, ("optimizer", "state", "0", "deep"), 800)  # the campaign's case: any depth past the bound
    with pytest.raises(
        LogError,
        match=r"rank-00000: unreadable checkpoint manifest \(maps and arrays nested deeper "
        r"than 68\); the checkpoint is damaged",
    ):
        load_checkpoint(tmp_path / "run", 1)
    with_nested(manifest, ("optimizer", "state", "0", "deep"), 64)  # within the manifest's bound, past the state's
    with pytest.raises(
        LogError,
        match=r"rank-00000: checkpoint manifest field 'optimizer\.state\.0' must be a map "
        r"nested at most 64 deep: the checkpoint is damaged",
    ):
        load_checkpoint(tmp_path / "run", 1)


@pytest.mark.parametrize("where", [("data", "deep"), ("optimizer", "state", "0", "deep"), ("rng", "deep")])
def test_nesting_deeper_than_msgpack_reads_is_refused_with_its_reason(tmp_path: Path, where: tuple[str, ...]) -> None:
    manifest = saved(tmp_path / "run")
    with_nested(manifest, where, 5000)
    with pytest.raises(LogError, match=r"unreadable checkpoint manifest \(maps and arrays nested deeper than 68\)"):
        load_checkpoint(tmp_path / "run", 1)


def test_a_sharded_manifest_nested_too_deep_is_refused_with_its_reason() -> None:
    for depth in (100, 5000):
        with pytest.raises(LogError, match=r"^m: unreadable checkpoint manifest \(maps and arrays nested deeper"):
            parse_manifest(nested(depth), "m")


def test_the_manifest_bound_grows_with_the_tensors() -> None:
    assert manifest_limit(0) == MANIFEST_BASE_BYTES and manifest_limit(10) > manifest_limit(1)


# VmHWM, not getrusage's ru_maxrss: Linux carries the parent's high-water mark into a child across fork and exec,
# so under a large pytest process ru_maxrss measured pytest.
PEAK = """
import re, sys
from pathlib import Path
from tracer.checkpoint import load_checkpoint
from tracer.errors import LogError
try:
    load_checkpoint(sys.argv[1], 1)
except LogError as exc:
    print(exc)
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) // 1024)
"""


@pytest.mark.slow  # a fresh Python process that imports torch
def test_a_2_gb_sparse_manifest_is_refused_from_its_size_in_little_memory(tmp_path: Path) -> None:
    manifest = saved(tmp_path / "run")
    subprocess.run(["truncate", "-s", "2G", str(manifest)], check=True)
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    message, peak_mib = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stderr
    assert (
        f"{manifest}: checkpoint manifest of {2 << 30} bytes, over the {manifest_limit(9)} a checkpoint of 9 "
        "tensors may have" in message
    )
    assert int(peak_mib) < 1024  # torch alone is a few hundred MiB; reading the file would be 2 GiB more
