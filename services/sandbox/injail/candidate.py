"""The program's process of a Python-tests job, in the sandbox (``bwrap.py`` joins this
file to the harness): it runs the program, then answers the checker's requests (call a
function of the program's, ask something of an object it returned) with plain values
(``wire.py``), one request at a time, until the checker closes its end.

It never holds the tests: the job's PID 1 forks it before anyone reads them, and the
checker (``checker.py``) runs them in a process of its own. Whatever the program does
here -- patch this loop, its builtins, its frames, exit -- changes only the values it
answers with, never how the checker judges them. Its descriptors: 3 the answers (to the
checker), 4 the requests (from it).
"""

from __future__ import annotations

import os
import sys

from arbiter.services.sandbox.injail.harness import CODE_NAME, with_exit  # one program: dropped
from arbiter.services.sandbox.injail.wire import WireError, wire_recv, wire_send  # dropped

ANSWER_FD, REQUEST_FD = 3, 4


def candidate_main(code):
    """Child: run the program (a code object compiled by PID 1), say ``ready`` with what
    the checker needs to bind the tests' names as the program's would be (``program_names``),
    then answer."""
    # a module sys.modules holds, so that what looks the program's module up (pickle of
    # its own classes, @dataclass, sys.modules[__name__]) finds its namespace
    import types

    module = types.ModuleType(CODE_NAME)
    scope = module.__dict__
    scope["__builtins__"] = with_exit()
    sys.modules[CODE_NAME] = module
    try:
        exec(code, scope)
    except BaseException as exc:
        wire_send(ANSWER_FD, ("L", f"the program raised {_exc_text(exc)}"))
        return
    wire_send(ANSWER_FD, ("ready", program_names(scope)))
    serve_requests(scope)


def program_names(scope):
    """The program's globals that shadow a builtin (its own ``sum``), and those that are
    standard modules (``sys`` imported by the program, used by MBPP's tests): name -> the
    module's name, or None for a shadow."""
    import builtins

    names: dict = {}
    for name, value in list(scope.items())[:10_000]:
        if type(name) is not str or name.startswith("__"):
            continue
        module = getattr(value, "__spec__", None) if type(value).__name__ == "module" else None
        if module is not None and type(module.name) is str:
            names[name] = module.name
        elif name in builtins.__dict__:
            names[name] = None
    return names


def serve_requests(scope):
    refs: dict = {}

    def other(obj):  # an object that is not a plain value: kept here, sent as a number
        refs[len(refs) + 1] = obj
        lazy = "i" if hasattr(type(obj), "__next__") else "o"  # an iterator: read as needed
        return "r", f"{len(refs)} {type(obj).__name__} {lazy}"

    def ref(kind, key):  # the checker hands back one of ours, or names one of the program's
        if kind == "n":
            return _lookup(scope, key)
        return refs[int(key.split(" ", 1)[0])]

    while True:
        try:
            request = wire_recv(REQUEST_FD, ref)
        except EOFError:
            _flush_and_exit()
        except (WireError, KeyError, NameError) as exc:
            wire_send(ANSWER_FD, ("e", "ValueError", f"the request cannot be read: {exc}"))
            continue
        reply: tuple
        try:
            reply = ("v", _answer(scope, refs, request))
        except BaseException as exc:
            reply = ("e", type(exc).__name__, _exc_text(exc, False), _builtin_base(exc), _args(exc))
        try:
            wire_send(ANSWER_FD, reply, other)
        except WireError as exc:
            wire_send(ANSWER_FD, ("x", f"the program's result cannot be sent: {exc}"))


def _answer(scope, refs, request):
    op, target = request[0], request[1]
    if op == "constants":  # the program's plain-valued globals among these names
        plain = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)
        return {n: scope[n] for n in request[2] if type(scope.get(n)) in plain}
    obj = _lookup(scope, target) if op == "call" else refs[target]
    if op in ("call", "callr"):
        return obj(*request[2], **request[3])
    if op == "attr":
        return getattr(obj, request[2])
    if op == "item":
        return obj[request[2]]
    if op == "contains":
        return request[2] in obj
    if op == "iter":
        return iter(obj)
    if op == "next":  # up to n items; fewer at its end
        items = []
        for _ in range(min(int(request[2]), 4096)):
            try:
                items.append(next(obj))
            except StopIteration:
                break
        return items
    if op == "len":
        return len(obj)
    if op == "bool":
        return bool(obj)
    return str(obj) if op == "str" else repr(obj)


def _args(exc):
    """The exception's arguments when they are plain scalars (KeyError's key), else None."""
    args = getattr(exc, "args", None)
    scalars = (int, float, str, bytes, bool, type(None))
    if type(args) is tuple and len(args) <= 8 and all(type(a) in scalars for a in args):
        return args
    return None


def _builtin_base(exc):
    """The nearest builtin exception class of ``exc``'s (a class merely named ValueError
    is not one): what the tests' ``except`` clauses may catch it as."""
    import builtins

    for cls in type(exc).__mro__:
        if builtins.__dict__.get(cls.__name__) is cls:
            return cls.__name__
    return "Exception"


def _lookup(scope, name):
    if name in scope:
        return scope[name]
    raise NameError(f"name '{name}' is not defined")


def _exc_text(exc, with_type=True):
    try:
        text = str(exc)
    except BaseException:
        text = ""
    if not with_type:
        return text[:500]
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def _flush_and_exit():
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105
            stream.flush()
        except BaseException:
            pass
    os._exit(0)
