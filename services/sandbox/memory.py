"""A sandbox's memory limit, shared out among its processes.

``SANDBOX_MEMORY_MB`` (a ``code_tests`` response) and ``SANDBOX_GRADER_MEMORY_MB`` (a
``python_grader`` one) bound a sandbox's processes together, not one process each. Nothing
in the sandbox can bound them as a group: a cgroup would, but a container or a pod rarely
gets a writable one (cgroup v1 hosts, Docker's read-only ``/sys/fs/cgroup``, Kubernetes
without delegation), so the limit is an accounting that holds on every host:

    M  =  tmp_mb                     the job's /tmp: a tmpfs, its files are memory
        + HARNESS_MB                 the job's PID 1 (the job, the children's pipes)
        + slots x process_mb         every other process of the job (RLIMIT_AS each)

    slots = processes + 1 for Python tests (the checker), processes for the others
    RLIMIT_NPROC = processes + ANCESTORS[kind]

RLIMIT_AS bounds what a process can map, so its resident memory too. RLIMIT_NPROC is
counted in the sandbox's own user namespace, where the zygote, the job's first fork, its
PID 1 and (Python tests) the checker are the only processes that are not the program's:
the program can have at most ``processes`` of its own at once. Threads count against
RLIMIT_NPROC but share their process's address space, so they only lower the count.

Outside the sum: the zygote and the job's first fork (the service's own code, never a
job's data, ~10 MB resident, most of it shared with every sandbox) and the kernel's own
memory for the processes (page tables, pipe and socket buffers, bounded by
``SANDBOX_MAX_OPEN_FILES`` per process). What could hold memory past RLIMIT_AS and /tmp
(memfd, System V IPC) the seccomp filter refuses (``seccomp.py``).
"""

from __future__ import annotations

from typing import Any

# The service's own process (uvicorn, the pool, its threads' stacks and malloc arenas):
# ~70 MB resident and ~310 MB of address space measured with 6 threads; ``arbiter up``
# bounds its address space to this (``arbiter.stack.sandbox_rlimits``).
SERVICE_MB = 2048
HARNESS_MB = 256  # the job's PID 1: the job's head (stdio inputs), output buffers, results
MIN_PROCESS_MB = 64  # the interpreter forked with the harness maps ~25 MB before any code
# the processes of a sandbox's user namespace that are not the program's, by the job's kind
ANCESTORS = {"tests": 4, "stdio": 3, "grader": 3, "session": 3}


def slots(kind: str, processes: int) -> int:
    """The processes of a job bounded by RLIMIT_AS ``process_mb``: the program's, and the
    checker for Python tests."""
    return processes + (1 if kind == "tests" else 0)


def process_mb(sandbox_mb: int, tmp_mb: int, kind: str, processes: int) -> int:
    """Each process's RLIMIT_AS, in MB: the sandbox's limit less its /tmp and PID 1's,
    divided among the job's other processes."""
    return (sandbox_mb - tmp_mb - HARNESS_MB) // slots(kind, processes)


def job_limits(
    limits: dict[str, Any], kind: str, sandbox_mb: int, processes: int, tmp_mb: int
) -> dict[str, Any]:
    """``limits`` (the job's) with the memory and process limits its harness applies:
    ``process_mb`` each process of the job, ``harness_mb`` its PID 1, ``ancestors`` the
    processes of the namespace RLIMIT_NPROC allows beside the program's ``processes``."""
    return {
        **limits,
        "sandbox_mb": sandbox_mb,
        "processes": processes,
        "process_mb": process_mb(sandbox_mb, tmp_mb, kind, processes),
        "harness_mb": HARNESS_MB,
        "ancestors": ANCESTORS[kind],
    }
