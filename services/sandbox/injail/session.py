"""A live Python interpreter for one session, in the sandbox (``bwrap.py`` joins this file to
the harness): the job's PID 1 supervises it (``run_session``), the interpreter runs the
cells (``repl_main``).

The channel. The service talks to PID 1 alone, over a unix socket of the session's own (the
job's second descriptor, ``job["channel"]``): frames of a 4-byte length and a body, the
service's marshalled (``{"code": …}``), PID 1's JSON (``dump``). PID 1 builds every frame
itself: it reads the interpreter's stdout and stderr from pipes, as text, and its CPU time
from the kernel. What a cell prints is output, never a frame; the interpreter's one line
back ("this cell is done") says only when to stop reading, so a cell that forges it cuts
its own output short and nothing more.

One fork per cell (``repl.py``): the interpreter that holds the session's state forks for
each cell and exits; the fork runs the cell, with its CPU time (RLIMIT_CPU) counted from
zero, and holds the state in turn. Once the holder has exited, PID 1 (the namespace's
init) adopts the fork: it reads its CPU clock, and gets its whole CPU time, with that of
every process it waited for, when it reaps it. So what the session used is counted by a
process no cell can reach (no ptrace, no ``/proc``: ``harness.py``). An interpreter that
dies (killed at its hard CPU limit, ``os._exit``) is replaced by a fresh one at the next
cell, after everything of the session is killed.

A cell that sleeps or waits gets ``KeyboardInterrupt`` at the wall-clock backstop
(``WALL_FACTOR`` x its CPU seconds + 1), and its interpreter is killed a second later if
it has not stopped. Threads a cell starts end when the next cell starts (a fork keeps only
the thread that forked); processes it starts may outlive it, each within its own CPU
limit, the session's process limit, and the session's life.
"""

from __future__ import annotations

import marshal
import os
import resource
import select
import time

from arbiter.services.sandbox.injail.harness import (  # one program in the sandbox: dropped there
    SIGNAL_NAMES,
    WALL_FACTOR,
    cpu_clock,
    dump,
    signal,
    spawn,
    sweep,
)
from arbiter.services.sandbox.injail.repl import read_exact, repl_main  # dropped there too

SESSION_GRACE_S = 1.0  # after the wall-clock interrupt, before the interpreter is killed
SESSION_HANDOVER_S = 5.0  # the holder gone, the fork's "start" line expected within this
SESSION_FRAME_MAX = 1 << 20  # bytes of a frame from the service
SESSION_LINES_MAX = 1 << 16  # bytes of the interpreter's lines kept unparsed


def run_session(job, budget):
    """The job's PID 1 for a session: a ready frame, then one answer per cell the service
    sends, until it closes the socket."""
    channel = job["channel"]
    interpreter = SessionInterpreter(budget, job["output_bytes"])
    try:
        interpreter.start()
    except OSError as exc:
        session_send(channel, {"ready": False, "error": f"no interpreter: {exc.strerror}"})
        return {}
    session_send(channel, {"ready": True})
    while True:
        request = session_recv(channel)
        if request is None:
            return {}
        session_send(channel, interpreter.run(request["code"]))


def session_send(fd, value):
    data = dump(value).encode("utf-8", "replace")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def session_recv(fd):
    """The service's next frame (a dict), or None once it closed the socket."""
    head = read_exact(fd, 4)
    if head is None or int.from_bytes(head, "big") > SESSION_FRAME_MAX:
        return None
    body = read_exact(fd, int.from_bytes(head, "big"))
    return None if body is None else marshal.loads(body)  # the service's own bytes


class SessionInterpreter:
    """PID 1's side of the interpreter: starts it, hands it cells, counts its CPU time, and
    kills everything of the session when it has to start over."""

    def __init__(self, budget, output_bytes):
        self.budget = budget
        self.cpu_s = budget.cpu_s
        self.wall_s = WALL_FACTOR * budget.cpu_s + 1
        self.output_bytes = output_bytes
        self.pid = None  # the interpreter holding the session (PID 1's child); None: none
        self.pidfd = None
        self.pipes: tuple[
            int, ...
        ] = ()  # its stdout, stderr and lines (read here), its cells (written here)
        self.seq = 0
        self.counted = 0.0  # CPU seconds of the session answered so far

    def start(self):
        res_r, res_w = os.pipe()
        req_r, req_w = os.pipe()
        try:
            pid, pidfd, out_r, err_r, _ = spawn(
                self.budget, "/dev/null", repl_main, (), self.cpu_s, (res_w, req_r)
            )
        except OSError:
            os.close(res_r)
            os.close(req_w)
            raise
        finally:
            os.close(res_w)
            os.close(req_r)
        for fd in (out_r, err_r, res_r, req_w):
            os.set_blocking(fd, False)
        self.pid, self.pidfd, self.pipes = pid, pidfd, (out_r, err_r, res_r, req_w)

    def stop(self):
        """Kill every process of the session but PID 1, reap them, close the pipes."""
        sweep()
        for fd in [*self.pipes, *([self.pidfd] if self.pidfd is not None else [])]:
            os.close(fd)
        self.pid, self.pidfd, self.pipes = None, None, ()

    def run(self, code):
        self.seq += 1
        if self.pid is None:
            try:
                self.start()
            except OSError as exc:
                return self.answer(None, "restarted", f"no interpreter: {exc.strerror}")
        cell = SessionCell(self, self.seq, code)
        status, message = cell.run()
        if status == "restarted":
            self.stop()
        return self.answer(cell, status, message)

    def answer(self, cell, status, message):
        session_reap_others(self.pid)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = usage.ru_utime + usage.ru_stime
        if self.pid is not None:
            total += cpu_clock(self.pid) or 0.0
        spent, self.counted = max(0.0, total - self.counted), max(total, self.counted)
        out, err = (cell.out, cell.err) if cell is not None else (SessionOutput(0),) * 2
        return {
            "status": status,
            "stdout": out.text(),
            "stderr": err.text(),
            "stdout_omitted": out.omitted,
            "stderr_omitted": err.omitted,
            "cpu_s": spent,
            "message": message,
        }


class SessionOutput:
    """The first ``limit`` bytes a stream gave, and how many more there were."""

    def __init__(self, limit):
        self.limit = limit
        self.data = bytearray()
        self.omitted = 0

    def add(self, chunk):
        room = max(0, self.limit - len(self.data))
        self.data += chunk[:room]
        self.omitted += max(0, len(chunk) - room)

    def text(self):
        return bytes(self.data).decode("utf-8", "replace")


class SessionCell:
    """One cell's run, seen from PID 1: the request written, the output read, the holder's
    handover to its fork, and the end (the fork's line, its death, or a clock)."""

    def __init__(self, interpreter, seq, code):
        self.it = interpreter
        self.seq = seq
        data = code.encode("utf-8", "surrogatepass")
        self.pending = b"%d %d\n" % (seq, len(data)) + data
        self.out = SessionOutput(interpreter.output_bytes)
        self.err = SessionOutput(interpreter.output_bytes)
        self.lines = bytearray()
        self.fork = None  # the pid the fork said it has
        self.holder_gone = None  # when the holder exited (handing over to its fork)
        self.handed_over = False
        self.early = None  # the fork's end, when it came before the fork was adopted
        self.wall_interrupt = False
        self.closed = set()  # pipes at their end

    def run(self):
        """(status, message): ``ok``, ``error``, ``interrupted`` (variables kept), or
        ``restarted`` (the interpreter is gone; the next cell starts a fresh one)."""
        it = self.it
        out_r, err_r, res_r, req_w = it.pipes
        deadline = time.monotonic() + it.wall_s
        while True:
            now = time.monotonic()
            gone = self.holder_gone
            waiting = gone is not None and not self.handed_over
            if gone is not None and waiting and now > gone + SESSION_HANDOVER_S:
                return "restarted", "the interpreter stopped before the cell started"
            if now >= deadline:
                if self.wall_interrupt or not self.handed_over:
                    return "restarted", (
                        f"the cell did not stop within {it.wall_s:g} s of wall-clock time "
                        "(it slept, waited, or ignored KeyboardInterrupt)"
                    )
                self.wall_interrupt = True
                os.kill(it.pid, signal.SIGINT)
                deadline = now + SESSION_GRACE_S
                continue
            watch = [fd for fd in (out_r, err_r, res_r) if fd not in self.closed]
            if not waiting:  # the holder's pidfd, reaped already, would stay readable
                watch.append(it.pidfd)
            ready, writable, _ = select.select(
                watch, [req_w] if self.pending else [], [], min(deadline - now, 0.5)
            )
            if writable:
                self.send(req_w)
            for fd, stream in ((out_r, self.out), (err_r, self.err)):
                if fd in ready:
                    self.read(fd, stream)
            done = self.read_lines(res_r) if res_r in ready else None
            if done is None and it.pidfd in ready:
                done = self.ended()
            if done is not None:
                self.drain()
                return done

    def send(self, fd):
        try:
            n = os.write(fd, self.pending[:65536])
        except BlockingIOError:
            return
        except OSError:  # no reader left: the interpreter's end shows in its pidfd
            n = len(self.pending)
        self.pending = self.pending[n:]

    def read(self, fd, stream, size=65536):
        try:
            chunk = os.read(fd, size)
        except BlockingIOError:
            return False
        if not chunk:
            self.closed.add(fd)
            return False
        stream.add(chunk)
        return True

    def drain(self):
        """What the cell left in its pipes, without waiting for processes still writing
        (at most a few MB: a process that never stops printing gets cut off)."""
        out_r, err_r, _, _ = self.it.pipes
        for fd, stream in ((out_r, self.out), (err_r, self.err)):
            for _ in range(64):
                if fd in self.closed or not self.read(fd, stream):
                    break

    def read_lines(self, fd):
        """The interpreter's lines: ``<seq> start <pid>``, ``<seq> nofork``, ``<seq> ok``
        (``error``, ``interrupted``); those of another cell are ignored."""
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return None
        if not chunk:
            self.closed.add(fd)
            return None
        self.lines += chunk
        del self.lines[: max(0, len(self.lines) - SESSION_LINES_MAX)]
        while b"\n" in self.lines:
            line, _, rest = bytes(self.lines).partition(b"\n")
            self.lines = bytearray(rest)
            parts = line.split()
            if len(parts) < 2 or parts[0] != b"%d" % self.seq:
                continue
            done = self.line(parts[1], parts[2:])
            if done is not None:
                return done
        return None

    def line(self, word, rest):
        if word == b"start" and rest and rest[0].isdigit() and self.fork is None:
            self.fork = int(rest[0])
            return self.adopt() if self.holder_gone is not None else None
        if word == b"nofork":
            limit = self.it.budget.limits["processes"]
            return "restarted", (
                f"the cell could not start: the session has its {limit} processes already "
                "(those earlier cells left running)"
            )
        if word not in (b"ok", b"error", b"interrupted"):
            return None
        by = rest[0] if rest and rest[0].isdigit() else b"0"
        if not self.handed_over:  # before the holder's exit was seen: kept until then
            self.early = (word, by)
            return None
        return self.finished(word, by)

    def finished(self, word, by):
        """The cell's end as the interpreter says it; ``interrupted``: by which signal
        (the interpreter's say, which words only its own message)."""
        if word != b"interrupted":
            return word.decode(), ""
        it = self.it
        if self.wall_interrupt and int(by) == signal.SIGINT:
            return "interrupted", (
                f"stopped at the wall-clock backstop ({it.wall_s:g} s): it slept or waited; "
                "its variables are kept"
            )
        if int(by) == signal.SIGXCPU:
            return "interrupted", f"stopped at its {it.cpu_s} s of CPU time; its variables are kept"
        return "error", ""  # its own KeyboardInterrupt

    def ended(self):
        """The holder or the cell's interpreter ended: reap it; the cell's end, or None
        while the holder hands over to its fork."""
        it = self.it
        try:
            _, status, usage = os.wait4(it.pid, 0)
        except ChildProcessError:
            status, usage = None, None
        if not self.handed_over:
            self.holder_gone = time.monotonic()
            return self.adopt() if self.fork is not None else None
        os.close(it.pidfd)
        it.pid = it.pidfd = None
        return "restarted", session_death(status, usage, it.cpu_s)

    def adopt(self):
        """The fork, once the holder is gone, is PID 1's child (the namespace's init adopts
        orphans): it becomes the interpreter. A pid that is not a child here is a lie."""
        it, pid = self.it, self.fork or 0
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "restarted", "the interpreter broke its protocol (a pid not its own)"
        os.close(it.pidfd)  # the holder's, reaped
        it.pid, it.pidfd = pid, os.pidfd_open(pid)
        self.handed_over = True
        # ended already: its pidfd says so at once
        return self.finished(*self.early) if self.early is not None else None


def session_death(status, usage, cpu_s):
    """Why the interpreter ended, in words."""
    if status is None:
        return "the interpreter ended"
    cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu >= cpu_s:
            return f"the cell ran past its {cpu_s} s of CPU time and was killed"
        return f"the interpreter was killed by {SIGNAL_NAMES.get(sig, f'signal {sig}')}"
    return f"the interpreter exited with status {os.WEXITSTATUS(status)}"


def session_reap_others(keep):
    """Reap every ended process but ``keep`` (the interpreter, reaped where it is watched):
    their CPU time joins PID 1's count."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None or found.si_pid == keep:
            return
        try:
            os.wait4(found.si_pid, 0)
        except ChildProcessError:
            return
