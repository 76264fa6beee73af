"""How many records one flipped byte costs a reader in skip mode: flips in a real recorded run's log.

    .venv/bin/python benchmarks/flip_losses.py [--where blocks|anywhere] [--flips 300] [--steps 3]

Records a small run of the reference workload (2 layers, `--steps` steps, one segment), then flips one byte at a time
(XOR 0xFF) at `--flips` seeded random positions: inside TENSOR_BLOCK frames (`blocks`) or anywhere in the segment
files (`anywhere`). Each flipped log is read with ``on_corruption="skip"`` and compared with the intact one's record
count; the script prints how many flips lost 0, 1, 2-9 and 10 or more records, how many the reader refused (an
SdcError even in skip mode: a run header lost with no other segment to take it from), and which record type held
the byte of each flip that lost 10 or more or was refused. docs/log-format.md ("TENSOR_BLOCK in format v3") says
what a flip may cost; this measures it.
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

from jobs.record import record_run
from tracer.errors import SdcError
from tracer.log import LogReader, RecordType, rank_dir
from tracer.options import TraceOptions
from workload.reference_config import load_config

SMALL = ["model.n_layers=2", "data.batch_size=2", "data.seq_len=32", "run.checkpoint_every=2", "train.threads=1"]


def frames(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, end, record type) of each frame of a segment's bytes."""
    out, pos = [], 16
    while pos + 9 <= len(data):
        length, _, rtype = struct.unpack_from("<IIB", data, pos)
        out.append((pos, pos + 9 + length, rtype))
        pos += 9 + length
    return out


def held_by(data: bytes, at: int) -> str:
    return next((RecordType(t).name for a, b, t in frames(data) if a <= at < b), "file header")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", choices=("blocks", "anywhere"), default="blocks")
    parser.add_argument("--flips", type=int, default=300)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        config = load_config(None, [*SMALL, f"run.steps={args.steps}"])
        record_run(config, run, node_label="flips", progress=False, trace=TraceOptions())
        rank = rank_dir(run, 0)
        intact = sum(1 for _ in LogReader(rank).records())
        segments = {p: p.read_bytes() for p in sorted(rank.glob("*.sdclog"))}
        if args.where == "blocks":
            spans = [(p, a, b) for p, d in segments.items() for a, b, t in frames(d) if t == RecordType.TENSOR_BLOCK]
        else:
            spans = [(p, 0, len(d)) for p, d in segments.items() for _ in range(len(d))]  # each byte alike
        rng = random.Random(48)
        lost: Counter[str] = Counter()
        worst: Counter[str] = Counter()
        for _ in range(args.flips):
            path, a, b = rng.choice(spans)
            at = rng.randrange(a, b)
            data = bytearray(segments[path])
            data[at] ^= 0xFF
            path.write_bytes(bytes(data))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    n = intact - sum(1 for _ in LogReader(rank, on_corruption="skip").records())
                except SdcError:
                    n = -1
            path.write_bytes(segments[path])
            bucket = "refused" if n < 0 else "0" if n == 0 else "1" if n == 1 else "2-9" if n < 10 else ">=10"
            lost[bucket] += 1
            if n < 0 or n >= 10:
                worst[f"{bucket} in {held_by(segments[path], at)}"] += 1
    size = sum(map(len, segments.values()))
    print(f"{len(segments)} segment(s), {size} bytes, {intact} records; {args.flips} flips ({args.where}):")
    print("  records lost: " + ", ".join(f"{k}: {lost[k]}" for k in ("0", "1", "2-9", ">=10", "refused")))
    print("  where the worst ones hit: " + (", ".join(f"{k}: {v}" for k, v in sorted(worst.items())) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
