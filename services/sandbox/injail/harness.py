"""The program inside each sandbox, standard library only: the plumbing of each job
(children, their pipes and limits, the answer). ``zygote.py`` runs the jobs, ``runners.py``
says what each kind of job does (Python tests: ``checking.py``, ``checker.py``,
``candidate.py``, ``wire.py``); ``bwrap.py`` joins them into one program.

Why a PID 1 per job: signals from inside its namespace that it has no handler for never
reach it (a program cannot kill its runner), ``kill(-1, SIGKILL)`` from it kills every
other process of the namespace (a fork bomb's leftovers, after each child), and its death
takes the whole namespace with it. Its children cannot reach into it: the seccomp filter
refuses ptrace, process_vm_* and pidfd_getfd, and the sandbox has no /proc (without a
filter, the job says ``no_dump`` and it makes itself undumpable instead). What jobs of one
zygote share is what nothing can write without a capability: the read-only files, the
network namespace (its own loopback only; a job's sockets die with its processes).
"""

from __future__ import annotations

# The standard library's lightest modules: the zygote imports them once, and every job's
# processes are forks of it.
import _signal as signal
import ctypes
import os
import resource
import select
import sys
import time

FRAME_LIMIT = 1 << 17  # result bytes a child may have unparsed: a line past half of it is too large
REASON_CHARS = 300
CODE_NAME = "__arbiter_program__"


def nonce():
    """A tag no program can guess, for the lines its child reports on."""
    return os.urandom(8).hex()


def cut(text, n=REASON_CHARS):
    """``text`` on one line, at most ``n`` characters, valid Unicode, no control characters
    (each would take 6 bytes in the answer): at most ~4 bytes a character in the answer."""
    text = " ".join(str(text).split()).encode("utf-8", "replace").decode("utf-8")
    text = text.translate(CONTROLS)
    return text if len(text) <= n else text[: n - 1] + "…"


CONTROLS = {i: "?" for i in [*range(32), 127]}


def no_dump():
    try:  # noqa: SIM105
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


class Budget:
    """The job's shared limits: the item's deadline, the output cap, and each test's limit:
    ``cpu_s`` seconds of CPU (RLIMIT_CPU of the process serving that test alone, whole
    seconds) with a wall-clock backstop ``wall_s``, several times longer, for a program
    that sleeps or waits."""

    def __init__(self, job):
        self.deadline = time.monotonic() + job["item_timeout_s"]
        self.output_left = job["output_limit"]
        self.limits = job["limits"]
        self.cpu_s = max(1, -int(-job["timeout_s"] // 1))
        self.wall_s = WALL_FACTOR * self.cpu_s + 1
        self.timeout = f"timeout ({self.cpu_s:g}s of CPU)"

    def left(self):
        return self.deadline - time.monotonic()


WALL_FACTOR = 10
PROBE_S = 0.2


def starved(cpu_s, window_s, limits):
    """Whether a program stopped by the wall-clock backstop was kept from running by the
    host rather than by its own choice. With the program's processes gone, a probe at the
    programs' niceness spins for ``PROBE_S``: the share of the CPU it gets is what a
    runnable program got. The program was starved when it used at least half of what that
    share would have given it over the window; one that slept or waited used (nearly)
    nothing, and on a quiet host the share is whole, so the backstop never fires first."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, limits["nice"])
            end = time.monotonic() + PROBE_S
            while time.monotonic() < end:
                pass
        finally:
            os._exit(0)
    usage = os.wait4(pid, 0)[2]
    share = min(1.0, (usage.ru_utime + usage.ru_stime) / PROBE_S)
    return cpu_s > 0 and cpu_s >= 0.5 * share * window_s


def cpu_of(usages):
    return sum(u.ru_utime + u.ru_stime for u in usages)


def cpu_clock(pid):
    """CPU seconds a live process has used so far (its process CPU clock); None once gone."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # glibc's MAKE_PROCESS_CPUCLOCK(pid, SCHED)
    except OSError:
        return None


def limit_child(limits, cpu_s):
    """In a fresh child, before any program code: rlimits, niceness, no core files."""
    mb = 1 << 20
    # the sandbox's memory shared out (memory.py): at most processes + ancestors processes
    # in its user namespace, each of the job's within process_mb of address space
    nproc = limits["processes"] + limits["ancestors"]
    for res, soft, hard in (
        (resource.RLIMIT_AS, limits["process_mb"] * mb, limits["process_mb"] * mb),
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, limits["file_mb"] * mb),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))
    os.setpriority(os.PRIO_PROCESS, 0, limits["nice"])


def spawn(budget, stdin_path, child_main, args, cpu_s=None, extra=None, out=True):
    """Fork a child: fd 0 from the file ``stdin_path``, fd 1/2 to pipes (fd 1 to
    ``/dev/null`` when not ``out``), fd 3 to the result pipe, or fds 3 and 4 to the two of
    ``extra``. Returns (pid, pidfd, out_r, err_r, res_r); out_r None when not ``out``."""
    out_r, out_w = os.pipe() if out else (None, os.open("/dev/null", os.O_WRONLY))
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe() if extra is None else (None, None)
    fd_in = os.open(stdin_path, os.O_RDONLY | os.O_NOFOLLOW)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            import fcntl

            keep = extra if extra is not None else (res_w,)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in keep if fd is not None]
            os.dup2(fd_in, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for k, fd in enumerate(high):
                os.dup2(fd, 3 + k)
            os.closerange(3 + len(high), 1 << 16)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            # the child's own streams on its fds, for the rest of its life
            sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
            sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
            limit_child(budget.limits, cpu_s or budget.cpu_s)
            code = 0
            child_main(*args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
            if exc.code is not None and not isinstance(exc.code, int):
                _print_err(str(exc.code))
        except BaseException:
            code = 1
            try:
                import traceback

                traceback.print_exc()
            except BaseException:
                pass
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:  # noqa: SIM105 - closed early: what was sent counts
                    stream.flush()
                except BaseException:
                    pass
            os._exit(code & 0xFF)
    for fd in [out_w, err_w, fd_in, *([res_w] if res_w is not None else [])]:
        os.close(fd)
    return pid, os.pidfd_open(pid), out_r, err_r, res_r


def _print_err(text):
    try:  # noqa: SIM105
        sys.stderr.write(text + "\n")
    except BaseException:
        pass


class Run:
    """One child's life seen from PID 1: its output (capped), its result frames, its end."""

    def __init__(self, budget, stdin_path, child_main, args, cpu_s=None, extra=None, out=True):
        # out False: its stdout goes to /dev/null, outside the output cap
        self.budget = budget
        self.pid, self.pidfd, out_r, err_r, self.res_r = spawn(
            budget, stdin_path, child_main, args, cpu_s, extra, out
        )
        self.fds = {err_r: "err"} if out_r is None else {out_r: "out", err_r: "err"}
        if self.res_r is not None:
            self.fds[self.res_r] = "res"
        self.buf = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
        self.status = None  # wait status once it ended
        self.usage = []  # rusage of the child and of what the sweep after it reaped
        self.over = None  # "output limit" or "result too large" when cut off

    def step(self, until):
        """One round of reading, until something arrives, the child ends or ``until``."""
        wait = until - time.monotonic()
        if wait <= 0 or self.status is not None:
            return
        ready, _, _ = select.select([*self.fds, self.pidfd], [], [], wait)
        for fd in ready:
            if fd == self.pidfd:
                self.reap()
                self.drain()
            elif fd in self.fds:
                self.read(fd)
        if self.over is not None:
            self.kill()

    def pump(self, until):
        """Read until the child ends (True) or ``until`` passes (False)."""
        while self.status is None and time.monotonic() < until:
            self.step(until)
        return self.status is not None

    def read(self, fd):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            raise
        except OSError:
            data = b""
        if not data:
            os.close(fd)
            del self.fds[fd]
            return
        name = self.fds[fd]
        if name == "res":
            if len(self.buf["res"]) + len(data) > FRAME_LIMIT:
                self.over = "result too large"
            self.buf["res"] += data[:FRAME_LIMIT]
            return
        self.budget.output_left -= len(data)
        if self.budget.output_left < 0:
            self.over = "output limit"
        keep = self.buf[name]
        keep += data
        if len(keep) > 4 * 65536 and name == "err":  # stderr: only its tail matters
            del keep[: len(keep) - 65536]

    def drain(self):
        """What is already buffered, without waiting for any process still holding a pipe."""
        for fd in list(self.fds):
            os.set_blocking(fd, False)
            while fd in self.fds and self.over is None:
                try:
                    self.read(fd)
                except BlockingIOError:
                    break

    def reap(self):
        _, self.status, usage = os.wait4(self.pid, 0)
        self.usage.append(usage)

    def kill(self):
        if self.status is None:
            try:  # noqa: SIM105
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reap()

    def finish(self):
        """Kill the child and everything it started, then read what they left in the pipes
        (nothing writes to them any more); close the fds."""
        self.kill()
        self.usage += sweep()
        self.drain()
        for fd in [*self.fds, self.pidfd]:
            os.close(fd)
        self.fds = {}

    def out_of_cpu(self):
        """Whether the child was killed for its CPU time (SIGXCPU, or SIGKILL at the hard
        limit when it ignored that)."""
        status, usage = self.status, self.usage[:1]
        if status is None or not os.WIFSIGNALED(status) or not usage:
            return False
        cpu = usage[0].ru_utime + usage[0].ru_stime
        return os.WTERMSIG(status) == signal.SIGXCPU or cpu >= self.budget.cpu_s

    def death(self):
        """Why the child ended, in words (its status)."""
        if self.over:
            return self.over
        if self.out_of_cpu():
            return f"ran out of CPU time: {self.budget.timeout}"
        status = self.status
        if status is None:
            return "still running"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXFSZ:
                return "hit the file size limit"
            return f"was killed by {SIGNAL_NAMES.get(sig, f'signal {sig}')}"
        return f"exited with status {os.WEXITSTATUS(status)}"

    def stderr_tail(self):
        lines = bytes(self.buf["err"]).decode("utf-8", "replace").strip().splitlines()
        return cut(lines[-1]) if lines else ""


def with_exit():
    """The builtins with ``exit`` and ``quit``, which ``site`` adds (the sandbox's
    interpreter runs without it): both raise ``SystemExit`` as there."""
    import builtins

    def exit(code=None):
        raise SystemExit(code)

    builtins.__dict__.update(exit=exit, quit=exit)
    return builtins


def python_exit():
    """The interpreter's own shutdown steps, in its order: wait for non-daemon threads,
    then run the ``atexit`` handlers (a handler's exception is printed, as there)."""
    import sys

    threading = sys.modules.get("threading")
    if threading is not None:
        try:  # noqa: SIM105
            threading._shutdown()
        except BaseException:
            pass
    import atexit

    atexit._run_exitfuncs()


def sweep():
    """Kill every process of the namespace but this one, and reap them all: their rusage."""
    try:  # noqa: SIM105
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    usage = []
    while True:
        try:
            usage.append(os.wait4(-1, 0)[2])
        except ChildProcessError:
            return usage


# ------------------------------------------------------------------ the answer

SIGNAL_NAMES = {
    signal.SIGABRT: "SIGABRT",
    signal.SIGBUS: "SIGBUS",
    signal.SIGFPE: "SIGFPE",
    signal.SIGILL: "SIGILL",
    signal.SIGKILL: "SIGKILL",
    signal.SIGPIPE: "SIGPIPE",
    signal.SIGSEGV: "SIGSEGV",
    signal.SIGTERM: "SIGTERM",
    signal.SIGTRAP: "SIGTRAP",
}


def dump(value):
    """``value`` as JSON (dicts, lists, strings, numbers, booleans, None): the answer the
    service parses, without importing json."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value) if value == value and abs(value) != float("inf") else "null"
    if isinstance(value, str):
        return '"' + "".join(ESCAPES.get(c) or c for c in value) + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{dump(str(k))}: {dump(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(dump(v) for v in value) + "]"


# JSON's escapes: the quote, the backslash, control characters; lone surrogates replaced
ESCAPES = {chr(i): f"\\u{i:04x}" for i in range(32)}
ESCAPES.update({'"': '\\"', "\\": "\\\\"})
ESCAPES.update({chr(i): "\ufffd" for i in range(0xD800, 0xE000)})
