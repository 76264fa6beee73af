"""Does draining the writer after every step over-count tracing's cost? Traced / untraced `tiny` with the writer
drained after every step, and after blocks of K steps (the writer's work counted either way).

    .venv/bin/python benchmarks/bench_drain_blocks.py [--block 10] [--blocks 15] [--config tiny]

`make bench` stops a traced step's clock after `Tracer.sync()`, a round trip to the I/O thread each step that a
training loop does not make. Here one sample is K steps of each variant in turn (shuffled), the traced block's clock
stopped after one `sync()` at its end; the ratio of means with its 95 % interval (`intervals.paired_ratio`) is
printed for K=1 and for K. If the per-step drain were what made tracing look expensive, the K-step ratio would be
lower. Not part of `make bench`: it checks the method, it is not a target.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from intervals import Ratio, paired_ratio
from timing import machine_load

from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import load_config


def block_ratio(config: str, block: int, blocks: int) -> Ratio:
    cfg = load_config(config)
    plain, traced = build(cfg), build(cfg)
    done = {"untraced": 0, "traced": 0}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Tracer(
            traced.model, traced.optimizer, out=Path(tmp) / "run", run=RunInfo("bench", config=cfg.to_dict()), echo=None
        ) as t,
    ):

        def untraced() -> float:
            start = time.perf_counter()
            with t.paused():
                for _ in range(block):
                    run_step(plain, done["untraced"])
                    done["untraced"] += 1
            return time.perf_counter() - start

        def traced_block() -> float:
            start = time.perf_counter()
            for _ in range(block):
                with t.step(done["traced"]):
                    run_step(traced, done["traced"], t)
                done["traced"] += 1
            t.sync()
            return time.perf_counter() - start

        variants, rng = [("untraced", untraced), ("traced", traced_block)], random.Random(0)
        seconds: dict[str, list[float]] = {"untraced": [], "traced": []}
        for index in range(blocks + 1):  # the first block of each warms up and is left out
            rng.shuffle(variants)
            for name, run in variants:
                taken = run()
                if index:
                    seconds[name].append(taken)
    return paired_ratio(seconds["traced"], seconds["untraced"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block", type=int, default=10, help="steps per drained block (default 10)")
    p.add_argument("--blocks", type=int, default=15, help="blocks of each variant (default 15)")
    p.add_argument("--config", default="tiny", help="workload config (default: tiny)")
    args = p.parse_args(argv)
    print(machine_load(), flush=True)
    for block, blocks in ((1, args.block * args.blocks), (args.block, args.blocks)):
        r = block_ratio(args.config, block, blocks)
        print(f"drained every {block:>3} steps: traced/untraced = {r.describe()} ({args.config})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
