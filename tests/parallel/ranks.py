"""Targets the multi-rank tests launch in every rank (``jobs.launch``); they return JSON."""

from __future__ import annotations

from typing import Any

from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import Config


def train_and_report(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """Train ``steps`` steps; the losses and each parameter's squared L2 norm (of this rank's shard)."""
    w = build(Config.from_dict(config))
    losses = [run_step(w, step) for step in range(steps)]
    squares = {n: float(p.detach().double().pow(2).sum()) for n, p in w.model.named_parameters()}
    sharded = [n for n, _ in w.model.named_parameters() if w.model.shard_dim(n) is not None]
    return {"losses": losses, "squares": squares, "sharded": sharded, "coords": w.layout.coords(w.groups.rank)}


def hang_on_rank_1() -> None:
    """Rank 1 never reaches the barrier rank 0 waits in."""
    import time

    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def sleep_with_pid_file(folder: str) -> None:
    """Write this rank's pid to ``folder``/rank-N.pid, then sleep for ten minutes."""
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    (Path(folder) / f"rank-{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def claim_on_rank_0(out: str) -> str:
    """Claim ``out`` on rank 0, as the ranks of `sdc record` do."""
    from pathlib import Path

    import torch.distributed as dist

    from tracer.log import claim_out_dir

    if dist.get_rank() == 0:
        with claim_out_dir(Path(out), role="train", overwrite=False):
            pass
    return "claimed"


def trace_in_torchrun(out: str, crash: bool) -> bool | None:
    """A user's own torchrun job (no launcher's lock): each rank traces one step into ``out``; returns whether a
    writer held the run's lock meanwhile, as `sdc watch` sees it. With ``crash``, rank 0 dies inside the Tracer."""
    import os
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from tracer.log import rank_dir
    from tracer.log.follow import LogFollower
    from tracer.options import RunInfo, TraceOptions
    from tracer.tracing import Tracer

    rank = dist.get_rank()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(model, optimizer, out=out, run=RunInfo(f"rank{rank}"), options=TraceOptions(activations=False)) as tr:
        with tr.step(0):
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
        dist.barrier()  # every Tracer is open
        alive = LogFollower(rank_dir(Path(out), rank)).writer_alive()
        if crash and rank == 0:
            os._exit(3)  # no clean close: the operating system drops what the process held
        dist.barrier()
    return alive


def lineage(variable: str) -> dict[str, Any]:
    """This rank's job process, the process that job's process was forked from (the zygote) and the value of
    ``variable`` in this rank's environment."""
    import os
    from pathlib import Path

    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    job = os.getppid()
    return {"job": job, "zygote": parent(job), "value": os.environ.get(variable)}
