"""The sandboxes' seccomp filter: classic BPF, as ``bwrap --seccomp FD`` reads it.

Namespaces hide the host from a program but leave it the whole system-call interface of
the host's kernel. The filter refuses, with EPERM, the calls that reach into other
processes (``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``: a program could
take its runner's pipe to the service), those that expose the kernel's riskier surfaces
(keyrings, ``bpf``, perf events, ``userfaultfd``, ``io_uring``) and those that hold memory
outside the sandbox's limits (``memfd_create``, ``memfd_secret``, ``shmget``, ``semget``,
``msgget``: a file in memory written and never mapped, or System V segments, semaphore
arrays and queues, escape RLIMIT_AS and /tmp's size) or change another process's limits
(``prlimit64`` with a pid: a program could starve its runner of descriptors), and kills a
process that calls
through another ABI (x32, i386), where the numbers below would not hold. Everything else
is allowed: an interpreter and its programs need the rest.
"""

from __future__ import annotations

import errno
import platform
import struct

# A seccomp filter (classic BPF, as bwrap --seccomp reads it) that refuses, with EPERM, the
# system calls that reach into other processes (ptrace, process_vm_*) or expose the kernel's
# riskier surfaces (keyrings, bpf, perf events, userfaultfd, io_uring) or hold memory outside
# the limits (memfd_*, System V IPC) or change another process's (prlimit64), and kills a process
# that calls through another ABI (x32, i386).
# Numbers per architecture.
SECCOMP_DENY = {
    # machine: (AUDIT_ARCH_*, {syscall: number}, prlimit64's number)
    "x86_64": (
        0xC000003E,
        {
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
            "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321,
            "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "pidfd_getfd": 438,
            "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "semget": 64,
            "msgget": 68,
        },
        302,  # prlimit64: refused for any process but the caller's own
    ),
    "aarch64": (
        0xC00000B7,
        {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
            "add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280,
            "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "pidfd_getfd": 438,
            "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "semget": 190,
            "msgget": 186,
        },
        261,
    ),
}  # fmt: skip


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter's instructions (``struct sock_filter``), or None on an architecture
    without a table here (the sandbox then runs without one; the log says so)."""
    found = SECCOMP_DENY.get(machine or platform.machine())
    if found is None:
        return None
    audit_arch, numbers, prlimit = found

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
    out = [op(ld, 0, 0, 4), op(jeq, 1, 0, audit_arch), op(ret, 0, 0, kill), op(ld, 0, 0, 0)]
    if audit_arch == 0xC000003E:  # x32 system calls on x86_64: bit 30 of the number
        out += [op(jge, 0, 1, 0x40000000), op(ret, 0, 0, kill)]
    for number in sorted(numbers.values()):
        out += [op(jeq, 0, 1, number), op(ret, 0, 0, eperm)]
    # prlimit64(pid, ...) with a pid other than 0 (itself): a program could lower its
    # runner's limits (same user) and make it fail; args[0] is at offset 16 (low word), 20
    out += [
        op(jeq, 0, 5, prlimit),  # not prlimit64: on to the allow
        op(ld, 0, 0, 16),
        op(jeq, 0, 2, 0),  # low word not 0: refused
        op(ld, 0, 0, 20),
        op(jeq, 1, 0, 0),  # high word 0 too: allowed
        op(ret, 0, 0, eperm),
    ]
    return b"".join([*out, op(ret, 0, 0, allow)])
