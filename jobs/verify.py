"""The verify-determinism job: record the same config twice in this environment and compare the runs bit for bit.

    comparison = verify_determinism(cfg.to_dict(), nproc=2)            # two recordings in a temporary folder
    comparison = verify_determinism(config, workload="my_pkg.train:build", keep=Path("verify"))  # kept in verify/a, b
    verify_determinism(config, keep=Path("verify"), trace=TraceOptions(capture=CapturePolicy(every=1)))  # + blobs

Both recordings are the record job's (`jobs.record.record`), as node ``verify-a`` and
``verify-b``, so whatever `sdc record` would record is what is compared
(`tracer.compare.compare_runs`). ``comparison.first`` is None when they are bit-identical. ``trace`` is what
both record (`sdc verify-determinism --report` captures the full tensors of the steps it audits, for their
ulp distances: `pipelines.nondeterminism`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobs.machine import check_resources
from jobs.record import RecordRequest, record
from tracer.compare import Comparison, compare_runs
from tracer.options import TraceOptions
from workload.protocol import REFERENCE


def verify_determinism(
    config: Mapping[str, Any],
    *,
    workload: str = REFERENCE,
    device: str = "cpu",
    nproc: int = 1,
    rank_timeout: float = 300.0,
    keep: Path | None = None,
    progress: bool = True,
    trace: TraceOptions = TraceOptions(),
) -> Comparison:
    """Record ``config`` twice on ``nproc`` ranks and compare every tensor event; with ``keep`` the two runs stay
    in ``keep/a`` and ``keep/b`` (replacing runs there), else in a temporary folder that goes at the end."""
    check_resources(config, nproc, "the config to verify")
    with tempfile.TemporaryDirectory(prefix="sdc-verify-") as tmp:
        root = keep or Path(tmp)
        for name in ("a", "b"):
            request = RecordRequest(
                out=root / name,
                node_label=f"verify-{name}",
                workload=workload,
                overwrite=True,
                progress=progress,
                device=device,
                trace=trace,
            )
            record(config, request, nproc=nproc, rank_timeout=rank_timeout)
        return compare_runs(root / "a", root / "b")
