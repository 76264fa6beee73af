"""The warm process a job's process is forked from: torch imported once per launching process, not once per job.

A job's process (`jobs.job_process`) needs torch, torch.distributed and Dynamo imported before it forks its ranks:
about 3 s of CPU. A process that launches many jobs (`sdc study`, `verify-determinism`, replays, a test session)
paid that for every one. Instead, the first launch starts a zygote (``python -m jobs.zygote FD``) that makes those
imports and then waits; each job's process is forked from it, already warm, and runs exactly what
``python -m jobs.job_process SPEC`` runs.

What a fresh process would get from its launcher, the fork gets too: the launcher's standard input, output and error
and the run's lock descriptors (sent with the request, SCM_RIGHTS), its environment and working folder, and a process
group of its own. Where the import-time environment differs (a variable other than the per-job ones in `PER_JOB`, or
the working folder), a new zygote is started for it, as torch and OpenMP read some variables when they load. Like the
job's process, the zygote runs no thread and no tensor op, so forking it is as safe as forking the job's ranks.

The zygote reports each job's pid and then its exit status (the launcher cannot wait for a grandchild), and exits
when its launcher goes (its socket closes); a job's process then finds itself reparented and stops its ranks
(`jobs.job_process`)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

# The variables a launch sets for its own job, and pytest's per-test one: none is read when torch loads, so they
# may differ between the zygote and the jobs it forks.
PER_JOB = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SDC_LAUNCHER_PID",
        "SDC_RUN_LOCK",
        "PYTEST_CURRENT_TEST",
    }
)
_MAX_MESSAGE = 1 << 20  # a request is a spec path, an environment and a folder: far below this
_MAX_FDS = 16  # standard input, output, error and the lock's descriptors
_REAP_S = 0.05  # how often the zygote looks for a finished job while one runs


def _import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_JOB}


@dataclass
class _Zygote:
    process: subprocess.Popen[bytes]
    sock: socket.socket
    key: tuple[str, str, tuple[tuple[str, str], ...]]
    owner: int  # the pid that started it: a process forked from the launcher shares its socket, never its zygote


@dataclass
class JobProcess:
    """A job's process forked by the zygote: its ``pid`` (also its process group) and `wait` for its exit code, as
    `subprocess.Popen` gives them (a negative code is the signal that killed it)."""

    pid: int
    _zygote: _Zygote = field(repr=False)
    _code: int | None = None

    def wait(self) -> int:
        while self._code is None:
            message = self._zygote.sock.recv(_MAX_MESSAGE)
            if not message:  # the zygote died: the job's process went with it or is orphaned and stops
                _ZYGOTES.pop(self._zygote.key, None)
                self._code = -signal.SIGKILL
                break
            report = json.loads(message)
            if report.get("pid") == self.pid and "status" in report:
                self._code = os.waitstatus_to_exitcode(report["status"])
        return self._code


_ZYGOTES: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Zygote] = {}


@atexit.register
def _close_all() -> None:
    """Close every zygote's socket and wait for it (each exits on its socket's end)."""
    for zygote in _ZYGOTES.values():
        zygote.sock.close()
        if zygote.owner != os.getpid():
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            zygote.process.wait(timeout=10)
    _ZYGOTES.clear()


def start_job(spec: str, env: Mapping[str, str], pass_fds: tuple[int, ...]) -> JobProcess:
    """Fork the job's process for ``spec`` (what ``python -m jobs.job_process SPEC`` runs) with ``env`` and ``pass_fds``
    at their numbers, from this process's zygote for that environment (started on first use)."""
    zygote = _zygote(env)
    fds = (0, 1, 2, *pass_fds)
    request = {"spec": spec, "env": dict(env), "cwd": os.getcwd(), "fds": list(fds)}
    socket.send_fds(zygote.sock, [json.dumps(request).encode()], list(fds))
    while True:  # the fork's pid; an earlier job's status nobody waited for (a launch interrupted) is passed over
        reply = zygote.sock.recv(_MAX_MESSAGE)
        if not reply:
            _ZYGOTES.pop(zygote.key, None)
            raise OSError(f"the job's zygote (pid {zygote.process.pid}) exited before it forked the job")
        forked = json.loads(reply)
        if "status" not in forked:
            return JobProcess(forked["pid"], zygote)


def _zygote(env: Mapping[str, str]) -> _Zygote:
    key = (sys.executable, os.getcwd(), tuple(sorted(_import_time_env(env).items())))
    if any(z.owner != os.getpid() for z in _ZYGOTES.values()):  # forked from a launcher: its zygotes are not ours
        _close_all()
    zygote = _ZYGOTES.get(key)
    if zygote is not None and zygote.process.poll() is None:
        return zygote
    _close_all()  # another environment's zygote: one at a time
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        process = subprocess.Popen(
            [sys.executable, "-m", "jobs.zygote", str(theirs.fileno())],
            env=_import_time_env(env),
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,  # each job gets the launcher's standard streams with its request
            stdout=subprocess.DEVNULL,  # (a pipe a caller reads to its end is not held open by the zygote)
            process_group=0,  # a terminal's Ctrl-C is the launcher's to handle; the zygote ends with its socket
        )
    ours.set_inheritable(False)
    _ZYGOTES[key] = _Zygote(process, ours, key, os.getpid())
    return _ZYGOTES[key]


def _serve(sock: socket.socket) -> None:
    """The zygote: import, then fork a job's process per request and report its pid and exit status, until the
    launcher closes the socket."""
    with contextlib.suppress(BaseException):  # a failure is left for each job's process to meet and report
        import torch._dynamo  # noqa: F401
        import torch.distributed  # noqa: F401
    jobs: set[int] = set()
    while True:
        readable, _, _ = select.select([sock], [], [], _REAP_S if jobs else None)
        for pid in list(jobs):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                jobs.discard(pid)
                sock.send(json.dumps({"pid": pid, "status": status}).encode())
        if not readable:
            continue
        message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _MAX_FDS)
        if not message:
            return  # the launcher is gone; a running job's process notices it was reparented
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            sock.close()
            os._exit(_job(request, fds))
        for fd in fds:
            os.close(fd)
        jobs.add(pid)
        sock.send(json.dumps({"pid": pid}).encode())


def _job(request: dict, received: list[int]) -> int:
    """In the forked job's process: become what ``python -m jobs.job_process SPEC`` would have been, then run it."""
    code = 1
    try:
        os.setpgid(0, 0)
        # Out of the way of the numbers they go to, then onto them (a received descriptor may sit on another's).
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in received]
        for fd in received:
            os.close(fd)
        for fd, target in zip(high, request["fds"], strict=True):
            os.dup2(fd, target, inheritable=True)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [sys.argv[0], request["spec"]]
        from jobs.job_process import run_job

        code = run_job(request["spec"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - as an uncaught error ends `python -m jobs.job_process`
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return code


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
