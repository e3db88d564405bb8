"""The sandbox's three kinds of job, run by the harness (``harness.py``) as PID 1.

The sandbox gets this file after ``harness.py``, ``zygote.py`` and ``compare.py`` as one
program (``bwrap.py`` drops the imports of those below, which are only for tools and
tests); it runs with the same few standard-library modules.

- ``tests``: ``program`` then ``tests`` (Python prepared by the service: each test wrapped
  in ``__arbiter_begin__/__arbiter_pass__/__arbiter_fail__`` calls) run in one child; each
  test's outcome comes back on a pipe, tagged with a per-child nonce. A test past
  ``timeout_s`` kills the child and the run goes on in a new child from the next test.
- ``stdio``: one child per test, the test's input as stdin; the digest of its stdout comes
  back for the service to compare (the expected outputs are not in the job).
- ``grader``: one child runs ``source`` and ``grade(sample, item)``; the result comes back
  on the pipe and must be a finite number.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from arbiter.services.sandbox.compare import plain_eq, plain_in  # dropped there too
from arbiter.services.sandbox.harness import (  # one program in the sandbox: dropped there
    CODE_NAME,
    Budget,
    Run,
    cut,
    no_dump,
    nonce,
    starved,
    sweep,
)
from arbiter.services.sandbox.zygote import serve  # dropped there too

# ------------------------------------------------------------------ tests (in process)


def tests_child(program, tests, start, stop_on_fail, nonce):
    """Child: the program, then the prepared tests from ``start``; each outcome a line
    ``nonce kind index reason`` on fd 3."""
    write = os.write

    def say(kind, index, reason=""):
        line = f"{nonce} {kind} {index} {cut(reason)}\n".encode("utf-8", "replace")
        write(3, line)

    failed = [False]

    def begin(index):
        if index < start or (stop_on_fail and failed[0]):
            return False
        say("S", index)
        return True

    def passed(index):
        say("P", index)

    def fail(index, exc):
        failed[0] = True
        if isinstance(exc, AssertionError):
            reason = "assertion failed" + (f": {exc}" if str(exc) else "")
        else:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        say("F", index, reason)

    hooks = {
        "__arbiter_begin__": begin,
        "__arbiter_pass__": passed,
        "__arbiter_fail__": fail,
        "__arbiter_eq__": plain_eq,
        "__arbiter_in__": plain_in,
    }
    scope = {"__name__": CODE_NAME, "__builtins__": __builtins__}
    try:
        code = compile(program, "<program>", "exec")
    except (SyntaxError, ValueError) as exc:
        say("L", -1, f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        return
    try:
        exec(code, scope)
    except BaseException as exc:
        say("L", -1, f"the program raised {type(exc).__name__}: {exc}")
        return
    scope.update(hooks)
    try:
        exec(compile(tests, "<tests>", "exec"), scope)
    except BaseException as exc:
        say("X", -1, f"the tests stopped: {type(exc).__name__}: {exc}")
        return
    say("E", -1)


class TestsRun(Run):
    def __init__(self, budget, job, start, nonce):
        self.nonce = nonce
        self.parsed: list[tuple[str, int, str]] = []
        # a start and an outcome per test, and the end: more is a program forging frames
        self.frames_left = 2 * (job["n_tests"] - start) + 4
        args = (job["program"], job["tests"], start, job["stop_on_fail"], nonce)
        cpu_s = int(job["item_timeout_s"]) + 1
        super().__init__(budget, "/dev/null", tests_child, args, cpu_s)

    def read(self, fd):
        """Parse each read's whole lines at once and drop them: ``FRAME_LIMIT`` bounds what
        is pending (a line being written), not what a child reports over all its tests."""
        super().read(fd)
        data = self.buf["res"]
        end = data.rfind(b"\n")
        if end < 0:
            return
        for raw in bytes(data[:end]).split(b"\n"):
            parts = raw.decode("utf-8", "replace").split(" ", 3)
            try:
                if len(parts) >= 3 and parts[0] == self.nonce:
                    self.frames_left -= 1
                    if self.frames_left < 0:
                        self.over = "result too large"
                        break
                    self.parsed.append((parts[1], int(parts[2]), cut("".join(parts[3:]))))
                    continue
            except ValueError:
                pass
            self.budget.output_left -= len(raw) + 1  # not the harness's: output like any other
        del data[: end + 1]
        if self.budget.output_left < 0:
            self.over = "output limit"

    def frames(self):
        """New result lines as (kind, index, reason); lines without the nonce are ignored."""
        out, self.parsed = self.parsed, []
        return out


def run_tests(job, budget):
    """Every test's (passed, reason). A child runs the program and the tests from ``start``;
    a test that overruns or kills its child fails, and a new child goes on after it."""
    n, per_test = job["n_tests"], job["timeout_s"]
    results: list[tuple[bool, str] | None] = [None] * n
    wall = False  # the item's deadline came before every test ran: not the program's doing
    begun = set()  # tests that started: a test's clock starts once, however often it says so
    start = 0
    while start < n:
        run = TestsRun(budget, job, start, nonce())
        current, progressed, stopped, clean = None, False, None, False
        clock = time.monotonic()  # when the running test (or the program's load) began
        while run.status is None and run.over is None and not clean:
            until = min(budget.deadline, clock + per_test)
            if time.monotonic() >= until:
                break
            run.step(until)
            for kind, index, reason in run.frames():
                if kind == "S" and 0 <= index < n and index not in begun:
                    begun.add(index)
                    current, progressed, clock = index, True, time.monotonic()
                elif kind in ("P", "F") and 0 <= index < n and results[index] is None:
                    results[index] = (kind == "P", "" if kind == "P" else reason or "failed")
                    current, clock = None, time.monotonic()
                elif kind in ("L", "X"):
                    stopped = reason
                elif kind == "E":
                    clean = True
        out_of_time = time.monotonic() >= budget.deadline
        overran = run.status is None and run.over is None and not clean  # we stop it
        run.finish()
        why = run.death()
        if current is not None and results[current] is None:
            if run.over:
                results[current] = (False, run.over)
            elif overran:
                results[current] = (False, f"timeout ({per_test:g}s)")
            else:
                results[current] = (
                    False,
                    f"the program {why} during the test" + _colon(run.stderr_tail()),
                )
        rest = [i for i in range(start, n) if results[i] is None]
        if not rest:
            break
        if stopped or clean or run.over or out_of_time or not progressed:
            if stopped:
                reason = stopped
            elif clean:
                reason = (
                    "not run: an earlier test failed"
                    if job["stop_on_fail"]
                    else "not reached by the tests"
                )
            elif run.over:
                reason = run.over
            elif out_of_time:
                reason = "not run: out of time"
                wall = True
            elif overran:
                reason = f"timeout ({per_test:g}s) before the tests ran"
            else:
                reason = f"the program {why} before the tests ran" + _colon(run.stderr_tail())
            for i in rest:
                results[i] = (False, reason)
            break
        if job["stop_on_fail"] and any(r is not None and not r[0] for r in results):
            for i in rest:
                results[i] = (False, "not run: an earlier test failed")
            break
        start = rest[0]
    return {"results": results, "wall": wall}


def _unlink(path):
    try:  # noqa: SIM105
        os.unlink(path)
    except OSError:
        pass


def _colon(text):
    return f": {text}" if text else ""


# ------------------------------------------------------------------ stdin/stdout


def stdio_child(program):
    """``python3 prog.py``: the program as ``__main__``, then what the interpreter does at
    exit: non-daemon threads joined, ``atexit`` handlers run (their output counts)."""
    scope = {"__name__": "__main__", "__builtins__": with_exit()}
    try:
        exec(compile(program, "<program>", "exec"), scope)
    finally:
        python_exit()


def with_exit():
    """The builtins with ``exit`` and ``quit``, which ``site`` adds (the sandbox's
    interpreter runs without it): both raise ``SystemExit`` as there."""
    import builtins

    def exit(code=None):
        raise SystemExit(code)

    builtins.exit = builtins.quit = exit
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


def output_digest(text):
    """A stdio test's output as the service compares it: SHA-256 of its lines without
    trailing whitespace, trailing blank lines dropped. The expected outputs never enter the
    sandbox (its program, a fork of PID 1, could read them from memory): the service
    compares this digest of what was printed with that of what was expected."""
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return _sha256()("\n".join(lines).encode("utf-8", "replace")).hexdigest()


def _sha256():
    """The interpreter's builtin SHA-256 (hashlib would load OpenSSL: ~5 ms a sandbox)."""
    try:
        from _sha256 import sha256  # Python 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # Python 3.12 and later
        except ImportError:
            from hashlib import sha256
    return sha256


def same_output(got, want):
    """Equal up to trailing whitespace on each line and trailing blank lines."""
    return output_digest(got) == output_digest(want)


def run_stdio(job, budget):
    """Each case in a child of its own, stdin from a file; a case that overran its CPU
    fails, one stopped by the wall-clock backstop while starved by the host (or not run
    before the item's deadline) makes the answer ``wall``: the service's null timeout."""
    results: list[tuple[bool | None, str]] = []
    for i, case in enumerate(job["cases"]):
        if budget.left() <= 0 or budget.output_left < 0:
            if budget.output_left >= 0:
                return {
                    "results": _rest(results, job["cases"], "not run: out of time"),
                    "wall": True,
                }
            results.extend((False, "output limit") for _ in job["cases"][i:])
            break
        path = f"/tmp/.stdin-{nonce()}"  # a name no earlier test could plant
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with open(fd, "wb") as f:
                f.write(case["input"].encode("utf-8", "replace"))
            run = Run(budget, path, stdio_child, (job["program"],))
        except OSError as exc:  # /tmp filled by the program's earlier tests: theirs to fail
            _unlink(path)
            results.append((False, f"the test's input could not be written: {exc.strerror}"))
            if job["stop_on_fail"]:
                results.extend(
                    (False, "not run: an earlier test failed") for _ in job["cases"][i + 1 :]
                )
                break
            continue
        _unlink(path)  # the program may have removed it already
        timed_out = not run.pump(min(budget.deadline, time.monotonic() + budget.wall_s))
        run.finish()
        if run.over:
            results.append((False, run.over))
        elif timed_out and (budget.left() <= 0 or starved(run.usage, budget.cpu_s)):
            results.append((False, "stopped by the wall clock: the host was busy"))
            return {"results": _rest(results, job["cases"], "not run: out of time"), "wall": True}
        elif timed_out:
            results.append((False, f"{budget.timeout}: it slept or waited"))
        elif run.out_of_cpu():
            results.append((False, budget.timeout))
        elif run.status != 0:
            results.append((False, f"the program {run.death()}" + _colon(run.stderr_tail())))
        else:
            got = bytes(run.buf["out"]).decode("utf-8", "replace")
            results.append((None, output_digest(got)))  # the service judges it
        if job["stop_on_fail"] and results[-1][0] is False:
            results.extend(
                (False, "not run: an earlier test failed") for _ in job["cases"][i + 1 :]
            )
            break
    return {"results": results}


def _rest(results, cases, reason):
    return results + [(False, reason) for _ in cases[len(results) :]]


# ------------------------------------------------------------------ grader


def grader_child(source, sample, item, nonce):
    write = os.write
    scope: dict = {"__name__": "__grader__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "<grader>", "exec"), scope)
        value = scope["grade"](sample, item)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"grade returned {type(value).__name__}, not a number")
        line = f"{nonce} score {float(value)!r}"
    except BaseException as exc:
        line = f"{nonce} error {type(exc).__name__}: {cut(exc)}"
    write(3, line.encode("utf-8", "replace") + b"\n")


def run_grader(job, budget):
    tag = nonce()
    sys.path[:0] = job["import_path"]  # the graders' packages (packages.py), read-only
    run = Run(budget, "/dev/null", grader_child, (job["source"], job["sample"], job["item"], tag))
    timed_out = not run.pump(min(budget.deadline, time.monotonic() + budget.wall_s))
    run.finish()
    if run.over:
        return {"error": run.over}
    if timed_out and (budget.left() <= 0 or starved(run.usage, budget.cpu_s)):
        return {"error": "stopped by the wall clock: the host was busy", "wall": True}
    if timed_out:
        return {"error": f"{budget.timeout}: it slept or waited"}
    if run.out_of_cpu():
        return {"error": budget.timeout}
    line = bytes(run.buf["res"]).split(b"\n", 1)[0].decode("utf-8", "replace")
    parts = line.split(" ", 2)  # "<nonce> score <repr>" or "<nonce> error <text>"
    if len(parts) != 3 or parts[0] != tag or parts[1] not in ("score", "error"):
        return {
            "error": f"grade gave no result (the grader {run.death()})" + _colon(run.stderr_tail())
        }
    if parts[1] == "error":
        return {"error": f"grade raised {parts[2]}"}
    try:
        score = float(parts[2])
    except ValueError:
        score = float("nan")
    if score != score or score in (float("inf"), float("-inf")):
        return {"error": f"grade returned {parts[2]}, not a finite number"}
    return {"score": score}


# ------------------------------------------------------------------ main

KINDS = {"tests": run_tests, "stdio": run_stdio, "grader": run_grader}


def answer_job(job):
    """The job's answer, in the job's PID 1 (``harness.serve``)."""
    if job.get("no_dump"):  # no seccomp filter here: ptrace and pidfd_getfd are not refused
        no_dump()
    budget = Budget(job)
    answer = KINDS[job["kind"]](job, budget)
    sweep()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    answer["cpu_s"] = usage.ru_utime + usage.ru_stime
    return answer


if __name__ == "__main__":  # run by the boot line (bwrap.BOOT), not imported
    serve(answer_job)
