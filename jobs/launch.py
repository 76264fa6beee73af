"""Start the ranks of a job on this machine, as torchrun would, and report a failed rank in one line.

    results = launch("jobs.record:record_rank", {"config": cfg.to_dict(), "request": request.to_json()}, nproc=4)

Each rank is a process with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), so the code it runs is the code a user's own ``torchrun`` job runs. It joins a gloo process group
and calls the target (``module:function``) with the spec's JSON arguments; what the target returns (JSON) comes
back as one result per rank. The ranks are forked from one process per job (jobs/job_process.py,
itself forked from a warm zygote (jobs/zygote.py) that has imported torch and Dynamo (which torch's
optimizers import as they are built); the job's process imports the target's module and the workload's (``preload``).
Those imports take about 3 s of CPU, paid once per launching process instead of once per rank and job. Nothing runs a
thread of its own or a tensor op before a fork (the user's workload is built in each rank; a workload module whose
import starts a thread is imported by each rank instead: jobs/job_process.py).

A rank that fails writes its error to a file and exits; the launcher stops the
other ranks (they would wait for it in their next collective) and raises one
`SdcError` naming the rank. The first rank to fail is the one reported: the others
usually fail only because it went away. ``timeout_s`` bounds every collective, so a
hung rank ends the job instead of hanging it. A rank whose launcher goes away (killed, out of memory) exits within
a second, as a crash, instead of holding the run's lock until its collectives time out: the job's process says so
in one line, the ranks say nothing, and a report nobody will read is not written (no traceback for a folder that
is gone).

One line per thing said, whatever the rank count: a warning the ranks give is printed as ``sdc: warning: ...`` on
one line, once for the job however many ranks give it (the first rank to give it claims it with a file in the
launcher's folder), and an error names its rank once.

A job starts at most `jobs.machine.max_local_ranks` processes (``RANKS_PER_CPU`` per CPU core),
so a rank count read from a file can never start an unbounded number of them. With
``lock`` (the run directory's `RunLock`), every rank inherits the writer lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jobs.job_process import FAILED, FOLDER_PREFIX
from jobs.machine import RANKS_PER_CPU, max_local_ranks
from jobs.zygote import start_job
from tracer import errors
from tracer.errors import CaptureError, SdcError, UsageError
from tracer.log.runlock import RunLock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    target: str,
    kwargs: Mapping[str, Any],
    nproc: int,
    *,
    timeout_s: float = 300.0,
    lock: RunLock | None = None,
    preload: Sequence[str] = (),
) -> list[Any]:
    """Run ``target(**kwargs)`` on ``nproc`` ranks; returns each rank's result, in rank order. ``preload``: modules
    the job's process imports before it forks the ranks (the workload's, named by the user, never by a file)."""
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: need at least 1 rank")
    if nproc > max_local_ranks():
        raise UsageError(
            f"{nproc} ranks: this machine runs at most {max_local_ranks()} "
            f"({RANKS_PER_CPU} per CPU core); use fewer ranks"
        )
    lock_env, lock_fds = lock.inherit() if lock is not None else ({}, ())
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX) as tmp:
        folder = Path(tmp)
        spec = folder / "spec.json"
        job = {"target": target, "kwargs": dict(kwargs), "timeout_s": timeout_s, "nproc": nproc, "preload": [*preload]}
        spec.write_text(json.dumps(job))
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")},  # each rank sets its own
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "SDC_LAUNCHER_PID": str(os.getpid()),
            **lock_env,
        }
        # Forked from the warm zygote (jobs/zygote.py), in its own process group, which holds the ranks too: one
        # signal stops them all.
        parent = start_job(str(spec), env, lock_fds)
        try:
            code = parent.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        if code != 0:
            failed = _failed_ranks(folder)
            if not failed and code < 0:  # the job's process was killed before it could name a rank
                how = next((sig.name for sig in signal.Signals if sig.value == -code), f"signal {-code}")
                raise CaptureError(
                    f"the job's process (pid {parent.pid}) was killed ({how}) before any rank failed; its ranks "
                    "were stopped with it"
                )
            raise _error(folder, failed or [0])
        return [json.loads((folder / f"result-{r}.json").read_text()) for r in range(nproc)]


def _failed_ranks(folder: Path) -> list[int]:
    """The ranks the job's process saw fail first; none where it failed itself."""
    path = folder / FAILED
    return json.loads(path.read_text()) if path.is_file() else []


def _error(folder: Path, failed: list[int]) -> SdcError:
    reports = []
    for rank in failed:
        path = folder / f"error-{rank}.json"
        report = json.loads(path.read_text()) if path.is_file() else {"type": "", "message": "exited without a report"}
        reports.append((rank, report))
    # A user's mistake (an SdcError) explains the others' lost connections.
    rank, report = next(((r, e) for r, e in reports if e.get("sdc")), reports[0])
    cls = getattr(errors, report["type"], None)
    if report.get("sdc") and isinstance(cls, type) and issubclass(cls, SdcError):
        message = str(report["message"])
        named = message if message.startswith(f"rank {rank}:") else f"rank {rank}: {message}"  # the rank, once
        try:
            return cls(named)
        except TypeError:  # an error class with its own constructor
            return SdcError(named)
    return CaptureError(f"rank {rank} failed: {report['type']}: {report['message']}".replace(": :", ":"))
