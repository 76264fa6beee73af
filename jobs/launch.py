"""Start the ranks of a job on this machine, as torchrun would, and report a failed rank in one line.

    results = launch("jobs.record:record_rank", {"config": cfg.to_dict(), "request": request.to_json()}, nproc=4)

Each rank is a process with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), so the code it runs is the code a user's own ``torchrun`` job runs. It joins a gloo process group
and calls the target (``module:function``) with the spec's JSON arguments; what the target returns (JSON) comes
back as one result per rank. The ranks are forked from one process per job (what ``python -m jobs.launch SPEC``
runs), itself forked from a warm zygote (jobs/zygote.py) that has imported torch and Dynamo (which torch's
optimizers import as they are built); the job's process imports the target's module. Those imports take about 3 s
of CPU, paid once per launching process instead of once per rank and job. Nothing runs a thread of its own or a
tensor op before a fork (the user's workload is built in each rank).

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
import hashlib
import importlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobs.machine import RANKS_PER_CPU, max_local_ranks
from jobs.zygote import start_job
from tracer import errors
from tracer.errors import CaptureError, SdcError, UsageError, sdc_error_of
from tracer.log.runlock import RunLock
from tracer.printable import printable_lines

# How often a rank checks that its launcher is still there.
_LAUNCHER_POLL_S = 0.5
# The launcher's folder for a job's spec and its ranks' reports: the one folder a rank may remove.
_FOLDER_PREFIX = "sdc-launch-"
# Where the job's process writes the ranks that failed first.
_FAILED = "failed.json"
# A warning's claim in the launcher's folder: the first rank to give it prints it (`_warn_once`).
_WARNED = "warned-{}"


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
        job = {"target": target, "kwargs": dict(kwargs), "timeout_s": timeout_s, "nproc": nproc}
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
    path = folder / _FAILED
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


def _main(spec_path: str) -> int:
    """The job's process: import what every rank needs, fork the ranks, wait for them."""
    spec = json.loads(Path(spec_path).read_text())
    folder, launcher = Path(spec_path).parent, int(os.environ["SDC_LAUNCHER_PID"])
    parent = os.getppid()  # the zygote: it exits when the launcher goes
    warnings.showwarning = _warn_once(folder)  # the ranks it forks inherit it
    _preload(spec["target"])
    ranks: dict[int, int] = {}
    for rank in range(spec["nproc"]):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _rank(spec, folder, rank)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        ranks[pid] = rank
    return _wait(ranks, launcher, parent, folder)


def _preload(target: str) -> None:
    """Import torch.distributed, Dynamo and the target's module; a failure is left for each rank to meet and
    report as its own."""
    try:
        import torch._dynamo  # noqa: F401 - imported once here instead of in every rank
        import torch.distributed  # noqa: F401

        importlib.import_module(target.partition(":")[0])
    except BaseException:  # noqa: BLE001 - the ranks report it
        pass


def _wait(ranks: dict[int, int], launcher: int, parent: int, folder: Path) -> int:
    """Wait for every rank (pid -> rank); on the first failures, record those ranks, stop the others and return 1.
    Exits at once when the launcher goes away (``parent``, the zygote it forked this process from, exits with it):
    the ranks then see this process go."""
    left = dict(ranks)
    while left:
        if os.getppid() != parent:
            print(
                f"sdc: error: the launcher (pid {launcher}) is gone; its {len(ranks)} rank(s) stop, their logs left "
                "as a crash's (sdc record --resume continues a recording)",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)
        failed = []
        for pid, rank in list(left.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del left[pid]
                if os.waitstatus_to_exitcode(status) != 0:
                    failed.append(rank)
        if failed:
            with contextlib.suppress(OSError):  # the launcher's folder is gone with it: nobody reads this
                (folder / _FAILED).write_text(json.dumps(sorted(failed)))
            for pid in left:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            return 1
        time.sleep(0.05)
    return 0


def _rank(spec: dict[str, Any], folder: Path, rank: int) -> int:
    """One rank, in a process forked from the job's."""
    import torch.distributed as dist

    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    _exit_without(os.getppid(), rank, folder)
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
        error = sdc_error_of(exc)  # one of ours, also where Dynamo re-raised it as its own
        report = {
            "type": type(error or exc).__name__,
            "sdc": error is not None,
            # Ours whole (its lines are meant: a module tree); another's first line only.
            "message": str(error) if error is not None else str(exc).splitlines()[0] if str(exc) else "",
        }
        with contextlib.suppress(OSError):  # the launcher's folder is gone with it: nobody reads the report
            (folder / f"error-{rank}.json").write_text(json.dumps(report))
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_without(parent: int, rank: int, folder: Path) -> None:
    """Exit this rank as soon as ``parent`` (the job's process) is no longer its parent: a launcher killed without
    the chance to stop its ranks (SIGKILL, the out-of-memory killer) leaves them to this, as the job's process
    exits when it sees the launcher go. The rank ends as a crashed one (its log without END, resumable); a watching
    thread, since the training loop may be in a long op or a collective. Rank 0 removes the launcher's ``folder``
    (the spec and the ranks' reports), which nobody will read now."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_LAUNCHER_POLL_S)
        # The job's process said why, once for all ranks (`_wait`).
        if rank == 0 and folder.name.startswith(_FOLDER_PREFIX):  # never a folder the launcher did not make
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="sdc-launcher-watch", daemon=True).start()


def _warn_once(folder: Path) -> Callable[..., None]:
    """A rank's ``warnings.showwarning``: ``sdc: warning: ...`` on one line, as the CLI prints its own, by the first
    rank to give that warning (it creates the warning's claim file in the launcher's ``folder``; the others find it
    there). Nothing where the folder is gone: the launcher is gone with it."""

    def show(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        text = str(message)
        claim = folder / _WARNED.format(hashlib.sha256(f"{category.__name__}: {text}".encode()).hexdigest()[:32])
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except OSError:
            return  # another rank printed it, or nobody is listening
        print(f"sdc: warning: {printable_lines(text)}", file=sys.stderr, flush=True)

    return show


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
