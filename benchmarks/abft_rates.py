"""ABFT on the reference workload: false-positive rate on healthy runs, detection rate by
fault kind and by the relative error of the corrupted element.

    .venv/bin/python benchmarks/abft_rates.py [--steps N] [--config CFG]

False positives: healthy float32 and bfloat16 runs with every matmul checked.
Detection: one run per fault kind; each hits one element of 5 % of the checked
calls (mm, addmm, bmm, baddbmm, linear), forward and backward. A fault counts as
detected when the abft event of the same call flags it. Each fault is scored on an
otherwise healthy run: once the checker has seen a corrupted result, the original
values are put back, so no fault inflates the inputs (and the bounds) of later
calls. The softmax-norm profile shows what ABFT cannot see. docs/faults.md quotes
the output.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from faults import FaultEmulator, FaultProfile, load_profile
from faults.abft import CHECKED, AbftChecker
from jobs.record import record_run
from tracer.intercept import Interceptor, below_autograd, own_ops
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import load_config

KINDS = {
    "bitflip, sign bit": 'kind = "bitflip"\nbits = "sign"',
    "bitflip, exponent bit": 'kind = "bitflip"\nbits = "exponent"',
    "bitflip, mantissa bit": 'kind = "bitflip"\nbits = "mantissa"',
    "bitflip, any bit": 'kind = "bitflip"\nbits = "random"',
    "scale x2": 'kind = "scale"\nfactor = 2.0',
    "scale x100-1000": 'kind = "scale"\nfactor = [100.0, 1000.0]',
    "stuck at 0": 'kind = "stuck"\nvalue = 0.0',
}
RULE = '[[fault]]\nops = ["mm", "addmm", "bmm", "baddbmm", "linear"]\np_call = 0.05\nelements = 1\n'
BUCKETS = [
    (1e-6, "< 1e-6"),
    (1e-3, "1e-6 .. 1e-3"),
    (1.0, "1e-3 .. 1"),
    (1e3, "1 .. 1e3"),
    (math.inf, ">= 1e3, inf, nan"),
]


def record(
    cfg_name: str | None, overrides: list[str], out: Path, profile: FaultProfile | None = None
) -> list[EventRecord]:
    cfg = load_config(cfg_name, overrides)
    record_run(cfg, out, node_label=out.name, progress=False, fault_profile=profile, abft=True)
    return [r for r in LogReader(rank_dir(out, 0)).records() if isinstance(r, EventRecord)]


class Undo(Interceptor):
    """Entered after the checker, so it sees each checked call first: once the checker (called through it) has
    seen a corrupted result, puts back what the emulator changed."""

    ops = CHECKED

    def __init__(self, log: list[tuple[str, dict]]) -> None:
        self.log = log

    def intercept(self, func, args, kwargs, call):  # noqa: ANN001, ANN201
        seen = len(self.log)
        out = call(*args, **kwargs)
        with own_ops(), below_autograd():
            for kind, f in self.log[seen:]:
                if kind == "fault":
                    out.view(-1)[f["index"]] = torch.tensor(f["original"], dtype=out.dtype)
        return out


def scored_faults(cfg_name: str | None, overrides: list[str], profile: FaultProfile) -> list[tuple[dict, bool]]:
    """Train with emulator, checker and undo; each fault with the verdict on the call it hit."""
    w = build(load_config(cfg_name, overrides))
    log: list[tuple[str, dict]] = []
    step = [0]
    hooks = {"clock": lambda: (step[0], 0), "sink": lambda kind, fields: log.append((kind, fields))}
    with FaultEmulator(profile, w.model, **hooks), AbftChecker(w.model, **hooks), Undo(log):
        for step[0] in range(w.cfg.run.steps):
            run_step(w, step[0])
    scored, pending = [], []
    for kind, fields in log:  # a call's fault events come just before its abft event
        if kind == "fault":
            pending.append(fields)
        else:
            scored += [(f, fields["verdict"] == "flag") for f in pending]
            pending = []
    return scored


def relative_error(fault: dict) -> float:
    o, c = fault["original"][0], fault["corrupted"][0]
    if not math.isfinite(c):
        return math.inf
    return abs(c - o) / abs(o) if o != 0 else (0.0 if c == 0 else math.inf)


def bucket(rel: float) -> str:
    return next(name for limit, name in BUCKETS if rel < limit or limit == math.inf)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    p.add_argument("--config", help="workload config (default: tiny)")
    args = p.parse_args(argv)
    base = [f"run.steps={args.steps}", "run.checkpoint_every=0"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"false positives on healthy runs ({args.steps} steps each):")
        for dtype in ("float32", "bfloat16"):
            checks = [e for e in record(args.config, [*base, f"model.dtype={dtype}"], root / dtype) if e.kind == "abft"]
            flags = sum(e.fields["verdict"] == "flag" for e in checks)
            worst = max(e.fields["residual"] / e.fields["bound"] for e in checks if e.fields["bound"] > 0)
            print(f"  {dtype:<9} {flags} flagged of {len(checks)} checks; largest residual/bound {worst:.2g}")
        print("detection of faults in checked matmuls (float32):")
        by_size: Counter[tuple[str, bool]] = Counter()
        for i, (name, kind) in enumerate(KINDS.items()):
            path = root / f"kind{i}.toml"
            path.write_text(f"seed = {i}\n{RULE}{kind}\n", encoding="utf-8")
            scored = scored_faults(args.config, base, load_profile(path))
            hits = sum(d for _, d in scored)
            print(f"  {name:<22} {hits:>4} / {len(scored):<4} detected ({hits / max(1, len(scored)):.0%})")
            by_size.update((bucket(relative_error(f)), d) for f, d in scored)
        print("detection by relative error |corrupted - original| / |original| (all kinds):")
        for _, name in BUCKETS:
            n = by_size[(name, True)] + by_size[(name, False)]
            hits = by_size[(name, True)]
            print(f"  {name:<18} {hits:>4} / {n:<4} detected" + (f" ({hits / n:.0%})" if n else ""))
        events = record(args.config, base, root / "blind", load_profile("softmax-norm"))
        faults = sum(e.kind == "fault" for e in events)
        flags = sum(e.kind == "abft" and e.fields["verdict"] == "flag" for e in events)
        print(f"softmax-norm profile (faults outside matmuls): {faults} faults, {flags} abft flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
