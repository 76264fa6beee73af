"""Start the ranks of a job on this machine, as torchrun would, and report a failed rank in one line.

    results = launch("jobs.record:record_rank", {"config": cfg.to_dict(), "request": request.to_json()}, nproc=4)

Each rank is a fresh Python process (``python -m jobs.launch SPEC``) with torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the code it
runs is the code a user's own ``torchrun`` job runs. It joins a gloo process group and
calls the target (``module:function``) with the spec's JSON arguments; what the
target returns (JSON) comes back as one result per rank.

A rank that fails writes its error to a file and exits; the launcher stops the
other ranks (they would wait for it in their next collective) and raises one
`SdcError` naming the rank. The first rank to fail is the one reported: the others
usually fail only because it went away. ``timeout_s`` bounds every collective, so a
hung rank ends the job instead of hanging it. A rank whose launcher goes away (killed, out of memory) exits within
a second, as a crash, instead of holding the run's lock until its collectives time out.

A job starts at most `jobs.machine.max_local_ranks` processes (``RANKS_PER_CPU`` per CPU core),
so a rank count read from a file can never start an unbounded number of them. With
``lock`` (the run directory's `RunLock`), every rank inherits the writer lock.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobs.machine import RANKS_PER_CPU, max_local_ranks
from tracer import errors
from tracer.errors import CaptureError, SdcError, UsageError
from tracer.log.runlock import RunLock

# How often a rank checks that its launcher is still there.
_LAUNCHER_POLL_S = 0.5
# The launcher's folder for a job's spec and its ranks' reports: the one folder a rank may remove.
_FOLDER_PREFIX = "sdc-launch-"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    target: str, kwargs: Mapping[str, Any], nproc: int, *, timeout_s: float = 300.0, lock: RunLock | None = None
) -> list[Any]:
    """Run ``target(**kwargs)`` on ``nproc`` ranks; returns each rank's result, in rank order."""
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: need at least 1 rank")
    if nproc > max_local_ranks():
        raise UsageError(
            f"{nproc} ranks: this machine runs at most {max_local_ranks()} "
            f"({RANKS_PER_CPU} per CPU core); use fewer ranks"
        )
    lock_env, lock_fds = lock.inherit() if lock is not None else ({}, ())
    with tempfile.TemporaryDirectory(prefix=_FOLDER_PREFIX) as tmp:
        folder = Path(tmp)
        spec = folder / "spec.json"
        spec.write_text(json.dumps({"target": target, "kwargs": dict(kwargs), "timeout_s": timeout_s}))
        port = free_port()
        procs = []
        try:
            for rank in range(nproc):
                env = {
                    **os.environ,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "SDC_LAUNCHER_PID": str(os.getpid()),
                    **lock_env,
                }
                procs.append(
                    subprocess.Popen([sys.executable, "-m", "jobs.launch", str(spec)], env=env, pass_fds=lock_fds)
                )
            failed = _wait(procs)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if failed:
            raise _error(folder, failed)
        return [json.loads((folder / f"result-{r}.json").read_text()) for r in range(nproc)]


def _wait(procs: list[subprocess.Popen]) -> list[int]:
    """Wait for every rank; on the first failure return the failed ranks (first failures first)."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed or all(c == 0 for c in codes):
            return failed
        time.sleep(0.05)


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
        try:
            return cls(f"rank {rank}: {report['message']}")
        except TypeError:  # an error class with its own constructor
            return SdcError(f"rank {rank}: {report['message']}")
    return CaptureError(f"rank {rank} failed: {report['type']}: {report['message']}".replace(": :", ":"))


def _main(spec_path: str) -> int:
    import torch.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    folder, rank = Path(spec_path).parent, int(os.environ["RANK"])
    _exit_without(int(os.environ["SDC_LAUNCHER_PID"]), rank, folder)
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=spec["timeout_s"]))
        module, _, name = spec["target"].partition(":")
        result = getattr(importlib.import_module(module), name)(**spec["kwargs"])
        (folder / f"result-{rank}.json").write_text(json.dumps(result))
        # Tear down together: gloo aborts a rank whose peer closes its pairs while it still holds them.
        dist.barrier()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher
        if os.environ.get("SDC_DEBUG") == "1":
            traceback.print_exc()
        report = {
            "type": type(exc).__name__,
            "sdc": isinstance(exc, SdcError),
            "message": str(exc).splitlines()[0] if str(exc) else "",
        }
        (folder / f"error-{rank}.json").write_text(json.dumps(report))
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_without(launcher: int, rank: int, folder: Path) -> None:
    """Exit this rank as soon as ``launcher`` is no longer its parent: a launcher killed without the chance to stop
    its ranks (SIGKILL, the out-of-memory killer) leaves them to this. The rank ends as a crashed one (its log
    without END, resumable); a watching thread, since the training loop may be in a long op or a collective.
    Rank 0 removes the launcher's ``folder`` (the spec and the ranks' reports), which nobody will read now."""

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(_LAUNCHER_POLL_S)
        print(f"rank {rank}: its launcher (pid {launcher}) is gone; stopping", file=sys.stderr, flush=True)
        if rank == 0 and folder.name.startswith(_FOLDER_PREFIX):  # never a folder the launcher did not make
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="sdc-launcher-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
