"""What always-on tracing costs: traced / untraced step time per model size, and the fingerprint's
throughput against this machine's memory copy bandwidth, each measured side by side in one run.

    .venv/bin/python benchmarks/bench_tracing.py [--steps N]

Targets (issue 16): traced / untraced <= 1.05 on `tiny` (stretch 1.03) and <= 1.03 on
`llama3-16l-mini`; fingerprint throughput / copy bandwidth >= 0.5; on CUDA, <= 1.02.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from timing import Interleaved, machine_load, side_by_side

from tracer.fingerprint import digest_implementation, digest_many
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.reference_config import load_config
from workload.reference import build

# Model sizes from the smallest shipped config to the largest: the ratio falls as compute per step grows
# faster than the bytes fingerprinted.
SCALING = (
    ("tiny", ()),
    ("tiny", ("model.dim=256",)),
    ("llama3-16l-mini", ()),
    ("llama3-32l-mini", ()),
)


@dataclass(frozen=True)
class Overhead:
    label: str
    params: int
    steps: Interleaved  # "untraced" and "traced"

    @property
    def ratio(self) -> float:
        return self.steps.ratio("traced", "untraced")

    def describe(self) -> str:
        return self.steps.describe("traced", "untraced")


def tracing_overhead(
    config: str, overrides: tuple[str, ...], steps: int, device: str = "cpu", out: Path | None = None
) -> Overhead:
    """Step times of an untraced and a traced copy of one workload, interleaved step by step; the traced run is
    kept in ``out`` if given."""
    cfg = load_config(config, list(overrides))
    plain, traced = build(cfg, device), build(cfg, device)
    with tempfile.TemporaryDirectory() as tmp:
        run = RunInfo("bench", config=cfg.to_dict())
        with Tracer(traced.model, traced.optimizer, out=out or Path(tmp) / "run", run=run, echo=None) as tracer:
            timed = side_by_side(plain, traced, tracer, steps)
    label = config + "".join(f" {o}" for o in overrides)
    return Overhead(label, sum(p.numel() for p in traced.model.parameters()), timed)


def bench_scaling(steps: int) -> list[Overhead]:
    rows = [tracing_overhead(config, overrides, steps) for config, overrides in SCALING]
    print(f"tracing vs size    : traced/untraced step time per model, the median of per-step ratios "
          f"({digest_implementation()} digests)")
    for r in rows:
        target = {"tiny": ", target <= 1.05", "llama3-16l-mini": ", target <= 1.03"}.get(r.label, "")
        print(f"  {r.label:<22} {r.params / 1e6:6.2f} M params  {r.describe()}{target})")
    return rows


def bench_throughput(megabytes: int = 256, repeats: int = 9) -> float:
    """Fingerprint bytes/s of one large float32 tensor over the bytes/s of copying it (torch's own threads)."""
    x = torch.randn(megabytes << 18)
    y = torch.empty_like(x)
    timed: dict[str, list[float]] = {"digest": [], "copy": []}
    ops: dict[str, Callable[[], object]] = {"digest": lambda: digest_many([x]), "copy": lambda: y.copy_(x)}
    for _ in range(repeats):
        for name, op in ops.items():
            s = time.perf_counter()
            op()
            timed[name].append(time.perf_counter() - s)
    digest_gbs, copy_gbs = (x.nbytes / statistics.median(timed[n]) / 1e9 for n in ("digest", "copy"))
    ratio = digest_gbs / copy_gbs
    print(f"fingerprint speed  : {digest_gbs:.1f} GB/s ({digest_implementation()}) vs copy {copy_gbs:.1f} GB/s, "
          f"both on torch's {torch.get_num_threads()} intra-op threads: ratio {ratio:.2f} (target >= 0.5)")
    return ratio


def bench_cuda(steps: int) -> float | None:
    if not torch.cuda.is_available():
        print("CUDA tracing       : skipped (no CUDA device here)")
        return None
    r = tracing_overhead("llama3-16l-mini", (), steps, device="cuda")
    print(f"CUDA tracing       : traced/untraced step time on {torch.cuda.get_device_name()} = {r.describe()}, "
          "target <= 1.02)")
    return r.ratio


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=15, help="steps per model size (default 15)")
    args = p.parse_args(argv)
    print(machine_load(), flush=True)
    bench_throughput()
    bench_scaling(args.steps)
    bench_cuda(args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
