"""The interpreter of a session, in the sandbox (``bwrap.py`` joins this file to the
harness): a child of the job's PID 1 (``session.py``), reading cells on fd 4 and writing
one line per cell on fd 3; its stdout and stderr are pipes PID 1 reads.

One fork per cell. The interpreter that ran the cell before holds the session's state
(variables, imports, functions); for the next cell it forks and exits, and the fork says
its pid, runs the cell, says how it ended, and then holds the state in turn. A fork's CPU
time starts at zero, so RLIMIT_CPU (the cell's CPU seconds, soft; one more, hard, set by
``harness.limit_child``) bounds each cell, and each process a cell starts, by the kernel:
at the soft limit the cell gets ``KeyboardInterrupt`` (its variables stay), at the hard
one the kernel kills it. Whatever a cell changes here (this loop, its lines) concerns its
own session's output only: PID 1 checks the pid, counts the CPU, and writes every answer.
"""

from __future__ import annotations

import os

from arbiter.services.sandbox.injail.harness import (  # one program in the sandbox: dropped there
    signal,
    with_exit,
)

SESSION_RESULT_FD, SESSION_REQUEST_FD = 3, 4  # the interpreter's: lines to PID 1, the cells


def read_exact(fd, n):
    """``n`` bytes from ``fd``, or None at its end first."""
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def repl_main():
    """The interpreter: for each cell it reads, a fork runs it in the session's namespace
    and goes on as the interpreter; this process exits (see the module docstring)."""
    import linecache  # tracebacks show a cell's lines
    import sys
    import types

    in_cell = [False]
    caught = [0]  # the signal that interrupted the cell

    def interrupt(signum, frame):  # SIGINT (the wall clock) or SIGXCPU (RLIMIT_CPU, soft)
        if in_cell[0]:
            caught[0] = signum
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGXCPU, interrupt)
    # line-buffered: what a cell printed before it was killed has reached PID 1
    sys.stdout = open(1, "w", 1, "utf-8", "backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", 1, "utf-8", "backslashreplace", closefd=False)  # noqa: SIM115
    # a module sys.modules holds, so that what looks a cell's module up (pickle of its own
    # classes, @dataclass) finds the session's namespace
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = with_exit()
    sys.modules["__main__"] = module
    scope = module.__dict__
    while True:
        seq, code = repl_request()
        try:
            pid = repl_fork()
        except OSError:
            os.write(SESSION_RESULT_FD, b"%d nofork\n" % seq)
            continue
        if pid:
            os._exit(0)  # the fork goes on with the session
        me = os.getpid()
        os.write(SESSION_RESULT_FD, b"%d start %d\n" % (seq, me))
        name = f"<cell {seq}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        in_cell[0], caught[0] = True, 0
        status = repl_cell(scope, code, name)
        in_cell[0] = False
        if status == b"interrupted":  # by which signal: PID 1 words its message by it
            status += b" %d" % caught[0]
        if os.getpid() != me:  # a process the cell forked, come back here: not the interpreter
            os._exit(0)
        for stream in (sys.stdout, sys.stderr):
            try:  # noqa: SIM105 - the cell may have closed or replaced it
                stream.flush()
            except BaseException:
                pass
        os.write(SESSION_RESULT_FD, b"%d %s\n" % (seq, status))


def repl_fork():
    """A fork of this process; at the process limit, once more after reaping the processes
    earlier cells started that have ended (they count until reaped)."""
    try:
        return os.fork()
    except OSError:
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        return os.fork()


def repl_request():
    """The next cell from PID 1: a line ``<seq> <bytes>``, then the code; exits at EOF."""
    head = b""
    while not head.endswith(b"\n"):
        byte = os.read(SESSION_REQUEST_FD, 1)
        if not byte:
            os._exit(0)
        head += byte
    seq, n = (int(x) for x in head.split())
    data = read_exact(SESSION_REQUEST_FD, n)
    if data is None:
        os._exit(0)
    return seq, data.decode("utf-8", "surrogatepass")


def repl_cell(scope, code, name):
    """Run the cell in the session's namespace: ``ok``, or its exception's traceback on
    stderr (without the harness's frames) and ``error`` (``interrupted`` for
    KeyboardInterrupt)."""
    import sys
    import traceback

    try:
        exec(compile(code, name, "exec"), scope)
        return b"ok"
    except BaseException as exc:
        try:
            shown = traceback.TracebackException(type(exc), exc, exc.__traceback__)
            # without the harness's frames (this loop, the signal handler), as a REPL shows it
            own = [f for f in shown.stack if f.filename != "harness"]
            shown.stack = traceback.StackSummary.from_list(own)
            sys.stderr.write("".join(shown.format()))
        except BaseException:
            pass
        return b"interrupted" if isinstance(exc, KeyboardInterrupt) else b"error"
