"""Bounds on reading a checkpoint manifest: its size before it is read, its nesting when it is decoded.

A manifest (plain `tracer.checkpoint.plain` or sharded `tracer.checkpoint.dcp_manifest`) holds a few entries per tensor
(fingerprint, layout, shard) and the plain state: optimizer scalars and param_groups, RNG, data cursor, other
states. Its size is capped before a byte is read, at ``MANIFEST_BASE_BYTES + MANIFEST_BYTES_PER_TENSOR`` times
the number of tensors its checkpoint holds (read from the safetensors headers, which are bounded themselves):
a 2 GB sparse file is refused from its size, not after it was read. Decoded maps and arrays nest at most
``MAX_MANIFEST_DEPTH`` deep anywhere in it; deeper is refused with the reason, never an empty one::

    raw = read_manifest(path, tensor_count([tensors_path]))
    manifest = decode_manifest(raw, str(path))
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from tracer.bounded_read import Bounds, parse_json
from tracer.errors import LogError
from tracer.log.records import MAX_DEPTH, nesting_depth_over
from tracer.regular_files import open_regular

MANIFEST_BASE_BYTES = 64 << 20  # RNG states, param_groups, data cursor and other states of any one checkpoint
MANIFEST_BYTES_PER_TENSOR = 64 << 10  # name, fingerprint, layout and shard entries, optimizer scalars of a tensor
MAX_SAFETENSORS_HEADER = 100 << 20  # what safetensors itself accepts
# names and metadata of a safetensors header: a flat map of tensor entries, metadata strings of any modest length
HEADER_BOUNDS = Bounds(file_bytes=MAX_SAFETENSORS_HEADER, depth=4, text=1 << 20)
_DAMAGED = "the checkpoint is damaged: restore it or record it again"
MAX_MANIFEST_DEPTH = MAX_DEPTH + 4  # data, states and param_groups (MAX_DEPTH) sit at most 4 levels in


def tensor_count(paths: Iterable[str | Path]) -> int:
    """Tensors the safetensors files hold, from their headers alone (each bounded); LogError names a bad one."""
    count = 0
    for path in paths:
        f, size = open_regular(path, "checkpoint tensors")
        with f:
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            count += header_tensor_count(head + f.read(min(length, MAX_SAFETENSORS_HEADER)), size, str(path))
    return count


def header_tensor_count(data: bytes, size: int, source: str) -> int:
    """Tensors in a safetensors file of ``size`` bytes whose start is ``data`` (at least its whole header)."""
    length = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else -1
    if not 0 < length <= min(MAX_SAFETENSORS_HEADER, size - 8, len(data) - 8):
        raise LogError(
            f"{source}: not a safetensors file (header length {length} of a {size}-byte file); "
            "the checkpoint is damaged: restore it or record it again"
        )
    header = parse_json(data[8 : 8 + length], f"{source} (safetensors header)", HEADER_BOUNDS, _DAMAGED, LogError)
    if not isinstance(header, dict):
        raise LogError(f"{source}: the safetensors header must be a map; the checkpoint is damaged")
    return len(header) - ("__metadata__" in header)


def manifest_limit(tensors: int) -> int:
    """The largest manifest a checkpoint of ``tensors`` tensors may have."""
    return MANIFEST_BASE_BYTES + MANIFEST_BYTES_PER_TENSOR * tensors


def check_manifest_size(source: str, size: int, tensors: int) -> None:
    """LogError when a manifest of ``size`` bytes is larger than `manifest_limit` allows."""
    limit = manifest_limit(tensors)
    if size > limit:
        raise LogError(
            f"{source}: checkpoint manifest of {size} bytes, over the {limit} a checkpoint of {tensors} "
            "tensors may have (tracer.checkpoint.manifest_bounds); the checkpoint is damaged: restore it or "
            "record it again"
        )


def read_manifest(path: str | Path, tensors: int) -> bytes:
    """A manifest's bytes, refused before reading when larger than `manifest_limit`."""
    f, size = open_regular(path, "checkpoint manifest")
    with f:
        check_manifest_size(str(path), size, tensors)
        try:
            return f.read(size)
        except OSError as exc:
            raise LogError(f"{path}: cannot read checkpoint manifest ({exc.strerror or exc})") from None


def decode_manifest(raw: bytes, source: str) -> Any:
    """Decode a manifest's msgpack, its nesting bounded; LogError with the reason otherwise."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except msgpack.StackError:
        value = None
        deep = True
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise LogError(f"{source}: unreadable checkpoint manifest ({str(exc) or type(exc).__name__})") from None
    else:
        deep = nesting_depth_over(value, MAX_MANIFEST_DEPTH)
    if deep:
        raise LogError(
            f"{source}: unreadable checkpoint manifest (maps and arrays nested deeper than "
            f"{MAX_MANIFEST_DEPTH}); the checkpoint is damaged: restore it or record it again"
        )
    return value
