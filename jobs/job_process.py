"""The job's process: what ``python -m jobs.job_process SPEC`` runs, forked from the zygote (jobs/zygote.py) for
each job `jobs.launch.launch` starts. It imports the target's module and the modules the spec asks to preload (the
workload's: torchtitan's model code takes 1-1.5 s of CPU to import, HF's Trainer 3.5 s, once per job instead of once
per rank), forks the ranks, and waits for them. A preloaded module that starts a thread as it imports would be left
without it in every rank (a fork copies one thread): the process then starts over as a fresh
``python -m jobs.job_process`` without the preload, and each rank imports it after its fork, as before. Each rank
joins the gloo process group with torchrun's environment and runs the target; a failed rank is recorded for the
launcher (`FAILED`) and the others are stopped; a launcher that went away stops the job at once (the ranks notice
their parent go). Warnings print once per job (`_warn_once`)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from tracer.errors import sdc_error_of
from tracer.printable import printable_lines

# How often a rank checks that its launcher is still there.
_LAUNCHER_POLL_S = 0.5
# The launcher's folder for a job's spec and its ranks' reports: the one folder a rank may remove.
FOLDER_PREFIX = "sdc-launch-"
# Where the job's process writes the ranks that failed first.
FAILED = "failed.json"
# A warning's claim in the launcher's folder: the first rank to give it prints it (`_warn_once`).
_WARNED = "warned-{}"


def run_job(spec_path: str) -> int:
    """The job's process: import what every rank needs, fork the ranks, wait for them."""
    spec = json.loads(Path(spec_path).read_text())
    folder, launcher = Path(spec_path).parent, int(os.environ["SDC_LAUNCHER_PID"])
    parent = os.getppid()  # the zygote: it exits when the launcher goes
    warnings.showwarning = _warn_once(folder)  # the ranks it forks inherit it
    if not _preload(spec["target"], spec.get("preload", [])):
        spec["preload"] = []  # in the launcher's folder, which only sdctrace writes
        Path(spec_path).write_text(json.dumps(spec))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "jobs.job_process", spec_path])
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


def _preload(target: str, modules: list[str]) -> bool:
    """Import torch.distributed, Dynamo, the target's module and ``modules``; a failure is left for each rank to
    meet and report as its own. False when importing ``modules`` started a thread (of Python or native: a thread
    pool a tensor op made counts too), so that forking this process would be unsafe."""
    try:
        import torch._dynamo  # noqa: F401 - imported once here instead of in every rank
        import torch.distributed  # noqa: F401

        importlib.import_module(target.partition(":")[0])
    except BaseException:  # noqa: BLE001 - the ranks report it
        pass
    before = _threads()
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException:  # noqa: BLE001 - the ranks report it
            pass
    return _threads() <= before


def _threads() -> set[str]:
    """This process's threads (their ids), native ones included where the system lists them."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return {str(t.ident) for t in threading.enumerate()}


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
                (folder / FAILED).write_text(json.dumps(sorted(failed)))
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
        if rank == 0 and folder.name.startswith(FOLDER_PREFIX):  # never a folder the launcher did not make
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
    sys.exit(run_job(sys.argv[1]))
