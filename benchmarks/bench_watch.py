"""How soon `sdc watch` reports a divergence: from the suspect's flush of the diverging record to the report.

    .venv/bin/python benchmarks/bench_watch.py [--config tiny] [--repeats 3]

Target (issue 15): within one step of the record reaching disk. The records are those
of a real `tiny` recording; the golden log is on disk already (a trusted node ahead
of the one under test), the suspect's is written step by step at the pace of that
recording (one flush per step, as the Tracer flushes), one fingerprint changed at
step `DIVERGE_AT`. The watch runs in a thread of this process, as it would beside
the writer; the ratio printed is latency / step time, measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import statistics
import sys
import tempfile
import threading
import time
from itertools import groupby
from pathlib import Path

from jobs.record import record_run
from sdc.commands.watch import EXIT_DIVERGED, Watch, WatchOptions
from tracer.log import EventRecord, LogReader, LogWriter, TensorRecord, rank_dir
from tracer.log.follow import POLL_S
from tracer.log.runlock import RunLock
from workload.reference_config import load_config

DIVERGE_AT = 6


class _Stamped(io.StringIO):
    """Output that notes when the first divergence is written."""

    def __init__(self) -> None:
        super().__init__()
        self.stamp: float | None = None

    def write(self, s: str) -> int:
        if self.stamp is None and "DIVERGENCE" in s:
            self.stamp = time.perf_counter()
        return super().write(s)


def bench_watch(config: str | None = None, steps: int = 10, repeats: int = 3) -> dict[str, float]:
    cfg = load_config(config, [f"run.steps={steps}", "run.checkpoint_every=0"])
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template"
        record_run(cfg, template, node_label="bench", progress=False)
        reader = LogReader(rank_dir(template, 0))
        header, records = reader.header, list(reader.records())
        step_s = statistics.median(
            r.fields["wall_s"] for r in records if isinstance(r, EventRecord) and r.kind == "step" and r.step > 0
        )
        latencies = [_latency(Path(tmp) / f"try{i}", header, records, step_s) for i in range(repeats)]
    latency = statistics.median(latencies)
    spread = f"{min(latencies) * 1e3:.0f}-{max(latencies) * 1e3:.0f} ms"
    print(
        f"watch latency      : suspect flush -> divergence reported = {latency * 1e3:.0f} ms (median of {repeats}, "
        f"{spread}) = {latency / step_s:.2f} of a {config or 'tiny'} step ({step_s * 1e3:.0f} ms; polls every "
        f"{POLL_S * 1e3:.0f} ms), target <= 1 step"
    )
    return {"latency_s": latency, "step_s": step_s, "ratio": latency / step_s}


def _latency(root: Path, header, records: list, step_s: float) -> float:  # noqa: ANN001
    golden, suspect = root / "golden", root / "suspect"
    _write(rank_dir(golden, 0), header, records)
    suspect.mkdir(parents=True)
    out, result = _Stamped(), []
    options = WatchOptions(idle_timeout_s=60, progress_every_s=3600)
    watcher = threading.Thread(target=lambda: result.append(Watch(golden, suspect, options, out=out).run()))
    flushed = None
    with RunLock.acquire(suspect), LogWriter(rank_dir(suspect, 0), header) as w:
        watcher.start()
        for step, group in groupby(records, key=lambda r: r.step):
            for r in group:
                if isinstance(r, TensorRecord):
                    if (step, r.phase.name) == (DIVERGE_AT, "BACKWARD") and flushed is None:
                        r = dataclasses.replace(r, fingerprint=r.fingerprint ^ 1)
                        flushed = 0.0
                    w.write_tensor(r)
                else:
                    w.write_event(r)
            w.flush()
            if step == DIVERGE_AT:
                flushed = time.perf_counter()
            time.sleep(step_s)  # the next step's compute
        watcher.join(60)
    assert result == [EXIT_DIVERGED] and out.stamp is not None and flushed, out.getvalue()
    return out.stamp - flushed


def _write(directory: Path, header, records: list) -> None:  # noqa: ANN001
    with LogWriter(directory, header) as w:
        for r in records:
            w.write_tensor(r) if isinstance(r, TensorRecord) else w.write_event(r)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    bench_watch(args.config, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
