"""Time the log writer alone: `LogWriter.write_tensor` and `write_event` for a run's records, to a file.

    .venv/bin/python benchmarks/bench_log_write.py [--records 100000] [--repeat 7]

The records are shaped as the Tracer writes a step of a small model (as `bench_diff.py` writes them): 76 TENSOR
records a step (two microbatches of the input and 12 sites forward and backward, then 13 parameters' GRAD and PARAM
records), then a `step` event; random 64-bit fingerprints. Each repeat writes a fresh log of `--records`
TENSOR records into a temporary directory and closes it (END and fsync included); the script prints the best and the
median time per record over the repeats, and the bytes per record. The cost is part of the traced step, which
`bench_tracing.py` measures as a whole; this one isolates the encoding (blocks, their checksums, framing). The
machine's other load moves the figures: compare runs made one after the other.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tracer.log import SCHEMA_VERSION, EventRecord, LogWriter, Phase, RunHeader, TensorRecord

SITES = [f"layers.{i}.{kind}" for i in range(6) for kind in ("attention", "feed_forward")]
PARAMS = [f"layers.{i}.{p}.weight" for i in range(6) for p in ("wq", "wo")] + ["tok_embeddings.weight"]
PER_STEP = 2 * (1 + 2 * len(SITES)) + 2 * len(PARAMS)  # 78


def step_records(step: int, rng: random.Random) -> list[TensorRecord]:
    def rec(mb: int, name: str, phase: Phase) -> TensorRecord:
        return TensorRecord(
            step, mb, name, phase, rng.getrandbits(64), rng.uniform(0, 100), rng.uniform(0, 5), 0, 0, "float32[8,64]"
        )

    out = []
    for mb in range(2):
        out.append(rec(mb, "input", Phase.INPUT))
        out += [rec(mb, s, Phase.FORWARD) for s in SITES]
        out += [rec(mb, s, Phase.BACKWARD) for s in reversed(SITES)]
    out += [rec(1, p, Phase.GRAD) for p in PARAMS] + [rec(0, p, Phase.PARAM) for p in PARAMS]
    return out


def write_once(directory: Path, steps: list[list[TensorRecord]]) -> tuple[float, int]:
    header = RunHeader(
        SCHEMA_VERSION, "bench", "node", "train", 1, 0, {}, "cfg", 0, "data", "lanes64-v1", {}, "cpu", {}, 0.0, {}
    )
    start = time.perf_counter()
    w = LogWriter(directory, header)
    for step, records in enumerate(steps):
        for r in records:
            w.write_tensor(r)
        w.write_event(EventRecord("step", step, {"loss": 2.5, "wall_s": 0.1, "microbatches": 2}))
    w.close()
    return time.perf_counter() - start, w.bytes_written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    steps = [step_records(s, rng) for s in range(-(-args.records // PER_STEP))]
    n = sum(map(len, steps))
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            seconds, size = write_once(Path(tmp) / f"log{i}", steps)
            times.append(seconds)
    print(f"{n} TENSOR records ({PER_STEP} a step, then a step event), {args.repeat} repeats")
    print(
        f"write: best {min(times) / n * 1e6:.3f} us/record, median {statistics.median(times) / n * 1e6:.3f} us/record"
    )
    print(f"size: {size / n:.2f} bytes/record (whole log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
