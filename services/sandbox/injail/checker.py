"""The checker of a Python-tests job, in the sandbox (``bwrap.py`` joins this file to the
harness): the process that runs the reference's tests and judges them, apart from the
program's.

The job's PID 1 forks it and it alone reads the tests (from the job's memfd, past what PID 1
read). A name the tests use but do not define (the entry point, a helper of the program's)
is a ``Remote``: calling it is a request to the program's process (``candidate.py``), which
answers with a plain value (``wire.py``) or the exception it raised, raised here in turn.
The values an assert compares are builtin values made here, so no object of the program's
decides an ``==``; the program cannot reach this process's memory, frames or hooks.

PID 1 forks the program's process at the first call and watches each test's CPU time on
its clock; the process keeps its state from test to test, as the tests expect (an object
made in setup, used by the asserts after). When it ends (a crash, its CPU time, an exit),
PID 1 writes why on its answers' pipe (``("D", reason)``): the running test fails so, and
PID 1 goes on after it with a new checker and a new process. A test that made no call to
the program and reads no value of its (``programs._tainted``) is no test (``U``).

To PID 1, on the control socket, one line each: ``S i`` (test i begins), ``P i``, ``F i
reason``, ``U i``; ``N`` (the program's process: PID 1 answers with its two pipe ends),
``R`` (it is ready), ``W`` (end it, and why did it end: PID 1 answers with the reason);
``E`` (all run) or ``X reason`` (the tests themselves failed).
"""

from __future__ import annotations

import builtins
import marshal
import os
import socket

from arbiter.services.sandbox.injail.harness import cut, signal  # one program: dropped there
from arbiter.services.sandbox.injail.wire import WireError, wire_recv, wire_send  # dropped


class ProgramFailed(BaseException):
    """The program's process could not answer (it died, ran out of time, sent junk): the
    running test fails with this reason. Not an ``Exception``: a test's ``except
    Exception`` (expecting the program to raise) does not take a dead program for one."""


class Link:
    """The checker's end of the program's current process."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.fds = None  # (requests, answers) of the current process
        self.started = False  # the program's process was asked for (once a checker)
        self.calls = 0  # requests since the previous test ended
        self.broken = ""  # the program fails at load: every test fails so
        self.gone = ""  # why its process ended
        self.names = {}  # the program's globals that shadow builtins or are modules
        self.gen = 0

    def say(self, line):
        self.ctl.sendall(line.encode("utf-8", "replace") + b"\n")

    def line(self):
        data = b""
        while not data.endswith(b"\n"):
            chunk = self.ctl.recv(4096)
            if not chunk:
                raise SystemExit(0)  # PID 1 is done with us
            data += chunk
        return data.decode("utf-8", "replace").strip()

    def start(self):
        self.started = True
        self.say("N")
        _, fds, _, _ = socket.recv_fds(self.ctl, 16, 2)
        if len(fds) != 2:
            raise SystemExit(0)
        self.fds, self.gen = fds, self.gen + 1
        try:
            first = wire_recv(fds[1])
        except (EOFError, OSError):
            first = (self.why(),)
        except WireError as exc:
            first = (f"the program's answer cannot be read: {exc}",)
        if isinstance(first, tuple) and len(first) == 2 and first[0] == "ready":
            self.say("R")
            self.names = first[1] if isinstance(first[1], dict) else {}
            return
        if isinstance(first, tuple) and len(first) == 2 and first[0] in ("L", "D"):
            first = (str(first[1]),)
        elif not (isinstance(first, tuple) and len(first) == 1 and isinstance(first[0], str)):
            first = ("the program's answer cannot be read",)
        self.broken = cut(first[0]) + " before the tests ran"
        self.close()
        self.why()  # PID 1 ends it

    def close(self):
        for fd in self.fds or ():
            os.close(fd)
        self.fds = None

    def why(self):
        self.say("W")
        return self.line() or "the program ended"

    def ask(self, request):
        if not self.started and not self.broken:
            self.start()
        if self.broken:
            raise ProgramFailed(self.broken)
        if self.fds is None:  # its process ended in an earlier request
            raise ProgramFailed(self.gone)
        self.calls += 1
        try:
            wire_send(self.fds[0], request, self.pack_ref)
        except WireError as exc:
            raise TypeError(f"the test passes what cannot reach the program: {exc}") from None
        except OSError:
            pass  # it is gone: the answer's end says so
        try:
            reply = recv_answer(self.fds[1], self.make_ref)
        except (EOFError, OSError):
            self.gone = f"{self.why()} during the test"
            self.close()
            raise ProgramFailed(self.gone) from None
        except WireError as exc:
            self.gone = f"the program's answer cannot be read: {exc}"
            self.close()
            self.why()  # PID 1 ends it
            raise ProgramFailed(self.gone) from None
        if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "v":
            return reply[1]
        if isinstance(reply, tuple) and len(reply) == 5 and reply[0] == "e":
            args = reply[4] if type(reply[4]) is tuple else None
            raise _exception(str(reply[1]), str(reply[2]), str(reply[3]), args)
        if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "x":
            raise ProgramFailed(cut(reply[1]))
        if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "D":  # from PID 1
            self.gone = f"{cut(reply[1])} during the test"
            self.close()
            raise ProgramFailed(self.gone)
        self.gone = "the program's answer cannot be read"
        self.close()
        self.why()
        raise ProgramFailed(self.gone)

    def pack_ref(self, obj):
        if isinstance(obj, Ref) and obj._gen == self.gen:
            return "r", obj._key
        if isinstance(obj, Remote):
            return "n", obj._name
        if isinstance(obj, Ref):
            raise WireError("an object the program made for an earlier test")
        raise WireError(f"a {type(obj).__name__} cannot be sent")

    def make_ref(self, kind, key):
        if kind != "r":
            raise WireError("not a value (a name)")
        return IterRef(self, key) if key.endswith(" i") else Ref(self, key)


LINK: Link | None = None
DECODE_CPU_S = 5.0  # the checker's CPU to read one answer of the program's


def recv_answer(fd, make_ref):
    """The program's answer, read within ``DECODE_CPU_S`` of our CPU: reading what the
    program sent is its doing, so past that the test fails (``WireError``)."""

    def over(signum, frame):
        raise WireError(f"reading it took more than {DECODE_CPU_S:g}s of CPU")

    old = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, DECODE_CPU_S)
    try:
        return wire_recv(fd, make_ref)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


class Remote:
    """A name of the program's, as the tests see it: calling it calls it there."""

    __slots__ = ("_name",)

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        assert LINK is not None
        return LINK.ask(("call", self._name, args, kwargs))

    def __repr__(self):
        return f"<the program's {self._name}>"


class Ref:
    """An object of the program's that is not a plain value (an instance of its own class,
    a function it returned): it stays there; the tests can hand it back, call it, take an
    attribute or an item, its length, truth or text -- each a request. It equals only
    itself: the program's ``__eq__`` never runs for an assert."""

    __slots__ = ("_gen", "_key", "_link")

    def __init__(self, link, key):
        self._link, self._key, self._gen = link, key, link.gen

    def _ask(self, op, *args):
        if self._gen != self._link.gen:
            raise ProgramFailed("an object of the program's from an earlier test is gone")
        return self._link.ask((op, int(self._key.split(" ", 1)[0]), *args))

    def __call__(self, *args, **kwargs):
        return self._ask("callr", args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("attr", name)

    def __getitem__(self, key):
        return self._ask("item", key)

    def __contains__(self, item):
        return self._ask("contains", item) is True

    def __iter__(self):
        return iter(self._ask("iter"))

    def __len__(self):
        n = self._ask("len")
        if type(n) is not int:
            raise TypeError("len() of the program's object is not an int")
        return n

    def __bool__(self):
        return self._ask("bool") is True

    def __str__(self):
        return str(self._ask("str"))

    def __repr__(self):
        return str(self._ask("repr"))


class IterRef(Ref):
    """An iterator of the program's (a generator, ``map``): read as the tests read it, a
    few items a request (1, 2, 4 … at most 1024), so its side effects happen as it is read
    and an endless one is read only as far as the tests go."""

    __slots__ = ("_buf", "_n")

    def __init__(self, link, key):
        super().__init__(link, key)
        self._buf, self._n = [], 1

    def __iter__(self):
        return self

    def __next__(self):
        if not self._buf:
            items = self._ask("next", self._n)
            if type(items) is not list or not items:
                raise StopIteration
            self._buf, self._n = items[::-1], min(self._n * 2, 1024)
        return self._buf.pop()


EXITS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")


def _exception(name, message, base, args=None):
    """The program's exception as the tests can catch it: a builtin one as itself, any
    other as a class of its name under its nearest builtin base (a class merely named
    ValueError is no ValueError); leaving the program is a failure, not a signal."""
    if base in EXITS or name in EXITS:
        return ProgramFailed(f"the program raised {name}" + (f": {message}" if message else ""))
    cls = getattr(builtins, base, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = Exception
    if name != base:
        cls = type(name if name.isidentifier() else "ProgramError", (cls,), {})
    try:
        if args is not None:
            return cls(*args)
        return cls(message) if message else cls()
    except Exception:
        return Exception(f"{name}: {message}")


def bind_names(names, program):
    """The tests' own value for each name they use and do not define: a standard module the
    program imported is imported here (the tests mean the module: MBPP's ``sys``), a
    builtin the program does not redefine stays the builtin, any other name is the
    program's (``Remote``)."""
    import sys

    # a builtin the program redefines is the program's only when the tests name nothing
    # else of it (MBPP 126's solution is sum): else it is the tests' own (abs, sorted …)
    own = [n for n in names if not hasattr(builtins, n) and not isinstance(program.get(n), str)]
    bound: dict = {}
    for name in names:
        module = program.get(name)
        if isinstance(module, str) and module.split(".")[0] in sys.stdlib_module_names:
            try:
                import importlib

                bound[name] = importlib.import_module(module)
                continue
            except Exception:
                pass
        if hasattr(builtins, name) and (own or name not in program):
            continue
        bound[name] = Remote(name)
    return bound


def constants(link, names):
    """The program's plain-valued globals among ``names`` (``LIMIT = 10``), as values: the
    tests use them as values, not as functions to call. Asked once, before the tests."""
    if not names or link.broken:
        return {}
    try:
        found = link.ask(("constants", 0, names))
    except BaseException:
        return {}
    finally:
        link.calls = 0
    return {n: v for n, v in found.items() if n in names} if type(found) is dict else {}


def prompt_helpers(prompt, entry, names):
    """The prompt's own definitions of the helpers the tests use (not the entry point): the
    prompt is the group's, run here; a response that redefines a helper changes its own
    program only."""
    if not prompt:
        return {}
    scope = {"__name__": "__arbiter_prompt__", "__builtins__": builtins}
    try:
        exec(compile(prompt, "<prompt>", "exec"), scope)
    except BaseException:
        return {}
    return {n: scope[n] for n in names if n != entry and callable(scope.get(n))}


def checker_main(ctl_fd, secret_fd, secret_at, start, stop_on_fail):
    """Child of PID 1: the tests from ``start``, each outcome a line on the control socket."""
    global LINK
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt from a program's kill
    ctl = socket.socket(fileno=ctl_fd)
    size = os.fstat(secret_fd).st_size - secret_at
    data = b""
    while len(data) < size:
        chunk = os.pread(secret_fd, size - len(data), secret_at + len(data))
        if not chunk:
            break
        data += chunk
    os.close(secret_fd)
    secret = marshal.loads(data)  # the service's own bytes
    LINK = link = Link(ctl)
    failed = [False]
    depends = [False]  # the running test reads a value of the program's (programs._tainted)

    def begin(i, dep=False):
        if i < start or (stop_on_fail and failed[0]):
            return False
        link.say(f"S {i}")
        link.calls = 0  # a call in the setup before it is not this test's
        depends[0] = dep is True
        return True

    def end(i, line):
        link.say(line)
        link.calls = 0

    def passed(i):
        end(i, f"P {i}" if link.calls or depends[0] else f"U {i}")

    def fail(i, exc):
        if not (link.calls or depends[0] or isinstance(exc, ProgramFailed)):
            end(i, f"U {i}")  # an assert on the tests' own values: not the program's doing
            return
        failed[0] = True
        if isinstance(exc, ProgramFailed):
            reason = str(exc)
        elif isinstance(exc, AssertionError):
            reason = "assertion failed" + (f": {exc}" if str(exc) else "")
        else:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        end(i, f"F {i} {cut(reason)}")

    scope = {"__name__": "__arbiter_tests__", "__builtins__": builtins}
    link.start()  # first: what the program defines decides what the tests' names are
    scope.update(bind_names(secret["names"], link.names))
    scope.update(constants(link, [n for n, v in scope.items() if isinstance(v, Remote)]))
    scope.update(prompt_helpers(secret.get("prompt") or "", secret.get("entry"), secret["names"]))
    scope.update(__arbiter_begin__=begin, __arbiter_pass__=passed, __arbiter_fail__=fail)
    try:
        exec(compile(secret["tests"], "<tests>", "exec"), scope)
    except BaseException as exc:
        link.say(f"X {cut(f'the tests stopped: {type(exc).__name__}: {exc}')}")
        return
    link.say("E")
