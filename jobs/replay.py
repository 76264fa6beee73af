"""The replay job: claim the replay log's directory once, then replay on this process (a single-rank run) or
on as many launched ranks as the golden run has.

    golden = golden_header(path)                         # rank 0's header, read once for the whole job
    suspect = suspect_from_run(run, golden, path)        # or suspect_from_profile("healthy-node"): once per job
    summaries = replay(ReplayRequest(path, out, steps, suspect), golden)   # one `ReplaySummary` per rank

A single rank runs the `Replayer` in this process with the request as it is; only
launched ranks get it serialised (`ReplayRequest.to_json`, the profile in its header
form), and they inherit the directory's lock instead of claiming it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.launch import launch
from jobs.machine import check_resources
from replay.golden import check_rank_logs
from replay.replayer import Replayer
from replay.request import ReplayRequest
from replay.results import ReplaySummary
from tracer.errors import UsageError
from tracer.log import LogReader, claim_out_dir, rank_dir
from tracer.log.records import RunHeader
from workload.protocol import REFERENCE, factory_modules


def golden_header(path: Path, nproc: int | None = None) -> RunHeader:
    """Rank 0's header of the golden run ``path``, checked against the rank logs on disk, against ``nproc`` (the
    ranks the user asked for, if any) and against the ranks, threads and memory this machine has
    (`jobs.machine.check_resources`), before anything is claimed or launched."""
    header = LogReader(rank_dir(path, 0)).header if path.is_dir() else None
    if header is None:
        raise UsageError(f"{path}: not a run directory; pass the golden run made by `sdc record`")
    n = header.world_size  # read from a file: checked against the disk and this machine before any launch
    if nproc is not None and nproc != n:
        raise UsageError(
            f"--nproc {nproc}: {path} was recorded on {n} rank(s), and a replay runs each of them with "
            f"its own shard, checkpoints and log: give --nproc {n}, or leave --nproc out"
        )
    check_rank_logs(path, n)
    check_resources(header.config, n, f"{path} (replay runs all its ranks here)")
    return header


def replay(request: ReplayRequest, golden: RunHeader, *, rank_timeout_s: float = 300.0) -> list[ReplaySummary]:
    """Run ``request`` on ``golden.world_size`` ranks (``golden``: `golden_header` of ``request.golden``); each
    rank's summary, in rank order. ``rank_timeout_s`` bounds every collective of a multi-rank replay."""
    inputs = (request.golden, request.suspect.run)
    if golden.world_size == 1:
        replayer = Replayer(request)  # indexes the golden log and checks the steps before the directory is touched
        with claim_out_dir(request.out, role="replay", overwrite=request.overwrite, inputs=inputs):
            return [replayer.run()]
    # Claimed before the ranks start, so a refusal is quick; every rank inherits the lock.
    with claim_out_dir(request.out, role="replay", overwrite=request.overwrite, inputs=inputs) as lock:
        results = launch(
            "jobs.replay:replay_rank",
            {"request": request.to_json()},
            golden.world_size,
            timeout_s=rank_timeout_s,
            lock=lock,
            preload=factory_modules(request.workload or REFERENCE),
        )
    return [ReplaySummary.from_json(r) for r in results]


def replay_rank(request: dict[str, Any]) -> dict[str, Any]:
    """One launched rank of a replay: what `launch` runs in each process."""
    return Replayer(ReplayRequest.from_json(request)).run().to_json()
