"""The zygote: the first process of each sandbox, serving its jobs one at a time.

Started ahead of need (``bwrap --as-pid-1 … python3 -I -S -c <boot>``: the interpreter
reads the code object of ``harness.py``, this file and the rest of ``bwrap.PARTS``,
compiled once by the service, from its stdin), it says ``{"ready": true}`` on stdout and
then serves jobs, one at a time, for as long as the service keeps it. Each job arrives as a
file descriptor on its stdin (a unix socket, ``SCM_RIGHTS``) holding the marshalled job
(a session's job with a second one: its socket to the service, ``session.py``),
never as bytes the zygote reads, so no job passes through its memory (which every later job
inherits). For each job it forks a process that makes fresh mount, PID, IPC and network
namespaces (loopback up), mounts a fresh empty ``/tmp`` tmpfs (bytes and inodes bounded)
and a devpts instance of its own, and forks the **job's PID 1**. That one starts a session
of its own (no process of the job shares a process group with the zygote), drops every
capability (the zygote keeps ``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN`` of its user namespace
for the namespaces), bounds its own memory, reads the job's head (never its tests:
``read_job``), runs it (``runners.py``), writes one JSON line with the results on stdout
and exits; the kernel then kills whatever is left in its namespace, and the zygote writes
``#exit STATUS`` once it is gone (and has the kernel collect any descriptor the job left in
flight in a unix socket). A zygote whose job
process was killed by a signal exits (nothing of a job can send one: the sandbox is not
sound), and the service replaces it. A job costs two forks, four namespaces and a mount
(~2.5 ms) instead of a new bwrap and interpreter (~12 ms).
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource

from arbiter.services.sandbox.injail.harness import (  # one program in the sandbox: dropped there
    dump,
    signal,
)

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x8000000, 0x20000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
CAP_VERSION_3 = 0x20080522


def serve(answer_job):
    """The zygote's loop: ready, then one job per descriptor received on stdin, until EOF."""
    import socket

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Python's own SIGINT handler would let a program raise KeyboardInterrupt in its PID 1
    # (a null instead of a failed test): without a handler, PID 1 never sees its signals
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    control = socket.socket(fileno=0)
    write_all(b'{"ready": true}\n')
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 64, 2)
        except OSError:
            os._exit(1)
        if not data:
            os._exit(0)
        tmp = data.decode("ascii", "replace").encode()  # the tmpfs options, "size=…,nr_inodes=…"
        if len(fds) not in (1, 2):
            for fd in fds:
                os.close(fd)
            write_all(b"#exit 255\n")
            continue
        pid = os.fork()
        if pid == 0:
            job_process(libc, control, fds[0], tmp, answer_job, fds[1:])
        for fd in fds:
            os.close(fd)
        status = os.waitpid(pid, 0)[1]
        if os.WIFSIGNALED(status):  # nothing of a job can signal it: the sandbox is not sound
            os._exit(1)
        # a descriptor the job sent into a unix socket of its own (a cycle) outlives its
        # processes, holding what it refers to (its /tmp's memory, a pty, a lock) until the
        # kernel's unix garbage collection runs: closing a unix socket starts it
        for end in socket.socketpair():
            end.close()
        write_all(b"#exit %d\n" % os.waitstatus_to_exitcode(status))


def job_process(libc, control, job_fd, tmp, answer_job, channel=()):
    """Fresh namespaces and /tmp, then the job's PID 1; exits as it does. Never returns.
    ``channel``: a session's socket to the service (``session.py``), PID 1's alone."""
    os.close(control.detach())
    os.open("/dev/null", os.O_RDONLY)  # fd 0 again: the children's pipes never take it
    try:
        check(
            libc, libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET), "unshare"
        )
        loopback_up()
        check(libc, libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount /")
        flags = MS_NOSUID | MS_NODEV
        check(libc, libc.mount(b"tmpfs", b"/tmp", b"tmpfs", flags, b"mode=1777," + tmp), "tmpfs")
        # its own ptys: the sandbox's devpts is shared by its jobs (a pty kept alive in flight
        # would be a channel to the next job); /dev/ptmx is bwrap's link to pts/ptmx
        pts = b"newinstance,ptmxmode=0666,mode=0620"
        check(
            libc,
            libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, pts),
            "devpts",
        )
        pid = os.fork()
    except OSError as exc:
        write_all(dump({"sandbox_error": f"the job's namespaces: {exc}"}).encode() + b"\n")
        os._exit(1)
    if pid == 0:
        code = 1
        try:
            os.setsid()  # its own session and process group: none of the zygote's to signal
            drop_capabilities(libc)
            os.chdir("/tmp")  # the fresh one: the zygote's cwd is the /tmp beneath it
            job = read_job(job_fd)  # the service's own bytes, without the tests
            if channel:
                job["channel"] = channel[0]
            # its own memory bounded too (harness_mb); its children lower theirs to process_mb
            limits = job["limits"]
            own, each = limits["harness_mb"] << 20, limits["process_mb"] << 20
            resource.setrlimit(resource.RLIMIT_AS, (own, max(own, each)))
            answer = answer_job(job)
            write_all(dump(answer).encode("utf-8", "replace") + b"\n")
            code = 0
        finally:
            os._exit(code)
    for fd in (job_fd, *channel):  # the service sees the channel end when PID 1 does
        os.close(fd)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF)


def read_job(fd):
    """The job's head (a length line, then its marshalled dict); what follows it (a
    Python-tests job's tests) stays unread in the memfd for the checker alone, at
    ``job["secret_at"]`` = (fd, offset)."""
    first = os.pread(fd, 32, 0)
    end = first.index(b"\n")
    n, data = int(first[:end]), b""
    while len(data) < n:
        chunk = os.pread(fd, n - len(data), end + 1 + len(data))
        if not chunk:
            break
        data += chunk
    job = marshal.loads(data)
    job["secret_at"] = (fd, end + 1 + n)
    return job


def check(libc, result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def drop_capabilities(libc):
    """No capability left in any set (ambient ones go with the permitted set): the job's
    processes run as the sandbox's plain user."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    header, data = Header(CAP_VERSION_3, 0), (Data * 2)()
    check(libc, libc.capset(ctypes.byref(header), data), "capset")
    check(libc, libc.capget(ctypes.byref(header), data), "capget")
    if any(d.effective or d.permitted or d.inheritable for d in data):
        raise OSError(1, "capabilities left after capset")


def loopback_up():
    """The new network namespace's ``lo`` up (as bwrap does): a job may talk to itself."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(
            "16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
        )[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def write_all(data):
    """``data`` to stdout (the service's pipe), unbuffered: no fork repeats it."""
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
