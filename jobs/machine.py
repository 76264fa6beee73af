"""What this machine can run: the one place a job checks the resources a recording asks for before using them.

    check_resources(header.config, ranks=header.world_size, source=str(run))   # before replay, fine-tune, verify
    launch(..., nproc=n)                                                         # refuses n > max_local_ranks()

A run header's config is read from a file, so everything it sizes is bounded by this machine before any process,
thread or tensor is made: the ranks (`max_local_ranks`, ``RANKS_PER_CPU`` per core), each rank's intra-op threads
(``THREADS_PER_CPU`` per core: a replay must use the recording's count, since it decides reduction order), and the
memory a step of the reference workload needs at the least (`workload.reference_memory.StepMemory`: the model's
weights, gradients and AdamW moments, and one microbatch's activations and logits) against the memory available
now. A bound exceeded is one `UsageError` naming the source, the field and what this machine has. Configs of other
workloads (``--workload``) are bounded by ranks and threads only where they hold the reference's keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tracer.errors import UsageError
from workload.reference_memory import StepMemory

RANKS_PER_CPU = 8  # more ranks than this per core is no job for one machine
THREADS_PER_CPU = 16  # intra-op threads of one rank per core: beyond, a replay would only thrash


def cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_local_ranks() -> int:
    """The most ranks `jobs.launch.launch` starts on this machine."""
    return RANKS_PER_CPU * cpus()


def available_memory() -> int | None:
    """Bytes of memory available to new allocations now (``MemAvailable``), or None where the OS does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _int(config: Mapping[str, Any], section: str, key: str) -> int | None:
    table = config.get(section)
    value = table.get(key) if isinstance(table, Mapping) else None
    return value if type(value) is int else None


def check_resources(config: Mapping[str, Any], ranks: int, source: str) -> None:
    """Refuse, in one line naming ``source``, a job whose ``config`` on ``ranks`` ranks asks for more ranks, threads
    or memory than this machine has."""
    cores = cpus()
    if ranks > max_local_ranks():
        raise UsageError(
            f"{source}: the recording asks for {ranks} ranks; this machine has {cores} core(s) and "
            f"runs at most {max_local_ranks()} ({RANKS_PER_CPU} per core): run it on a larger machine"
        )
    threads = _int(config, "train", "threads")
    if threads is not None and threads > THREADS_PER_CPU * cores:
        raise UsageError(
            f"{source}: the recording asks for {threads} threads (train.threads) per rank; this machine "
            f"has {cores} core(s) and runs at most {THREADS_PER_CPU * cores} ({THREADS_PER_CPU} per core), "
            "and the count decides reduction order, so it cannot be lowered: run it on a machine with "
            "more cores"
        )
    need, free = StepMemory.of(config), available_memory()
    if need is not None and free is not None and need.bytes * ranks > free:
        raise UsageError(
            f"{source}: the recording asks for at least {_gib(need.bytes * ranks)} of memory ({need.describe()}, "
            f"on {ranks} rank(s)); this machine has {_gib(free)} available: run it on a machine with "
            "more memory"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
