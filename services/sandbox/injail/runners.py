"""The sandbox's four kinds of job, run by the harness (``harness.py``) as PID 1.

The sandbox gets this file after the others of ``bwrap.PARTS`` as one program (``bwrap.py``
drops the imports of those, which are only for tools and tests); it runs with the same few
standard-library modules.

- ``tests``: the program in processes of its own, the prepared tests (each wrapped in
  ``__arbiter_begin__/__arbiter_pass__/__arbiter_fail__`` calls) in the checker's, plain
  values between them (``checking.py``).
- ``stdio``: one child per test, the test's input as stdin; the digest of its stdout comes
  back for the service to compare (the expected outputs are not in the job).
- ``grader``: one child runs ``source`` and ``grade(sample, item)``; the result comes back
  on the pipe and must be a finite number.
- ``session``: a live interpreter, one cell at a time, until the service closes the
  session's socket (``session.py``).
"""

from __future__ import annotations

import os
import resource
import sys
import time

from arbiter.services.sandbox.injail.checking import run_tests  # dropped there too
from arbiter.services.sandbox.injail.harness import (  # one program in the sandbox: dropped there
    Budget,
    Run,
    cpu_of,
    cut,
    no_dump,
    nonce,
    python_exit,
    starved,
    sweep,
    with_exit,
)
from arbiter.services.sandbox.injail.session import run_session  # dropped there too
from arbiter.services.sandbox.injail.zygote import serve  # dropped there too


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
    fails, as does one that slept or waited past the wall-clock backstop; one the backstop
    or the item's deadline stopped while it could run (the host starved it), or a case not
    run before the deadline, makes the answer ``wall``: the service's null timeout."""
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
        began = time.monotonic()
        timed_out = not run.pump(min(budget.deadline, began + budget.wall_s))
        run.finish()
        if run.over:
            results.append((False, run.over))
        elif timed_out and _ran(run, budget, began):
            results.append((False, "stopped by the wall clock: the host was busy"))
            return {"results": _rest(results, job["cases"], "not run: out of time"), "wall": True}
        elif timed_out:
            results.append((False, f"{budget.timeout}: it slept or waited"))
            if budget.left() <= 0:  # its own waiting took the response's time
                return {"results": _rest(results, job["cases"], "not run: out of time")}
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


def _ran(run, budget, began):
    """Whether a child stopped by a clock could run all along (the host's doing)."""
    return starved(cpu_of(run.usage), time.monotonic() - began, budget.limits)


def _rest(results, cases, reason):
    return results + [(False, reason) for _ in cases[len(results) :]]


# ------------------------------------------------------------------ grader


def grader_child(source, sample, item, nonce):
    write = os.write
    scope: dict = {"__name__": "__grader__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "<grader>", "exec"), scope)
        value = scope["grade"](sample, item)
        import numbers  # a real number of any kind (numpy's int64 and float32 too), not a bool

        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"grade returned {type(value).__name__}, not a number")
        line = f"{nonce} score {float(value)!r}"
    except BaseException as exc:
        line = f"{nonce} error {type(exc).__name__}: {cut(exc)}"
    write(3, line.encode("utf-8", "replace") + b"\n")


def run_grader(job, budget):
    tag = nonce()
    sys.path[:0] = job["import_path"]  # the graders' packages (packages.py), read-only
    run = Run(budget, "/dev/null", grader_child, (job["source"], job["sample"], job["item"], tag))
    began = time.monotonic()
    timed_out = not run.pump(min(budget.deadline, began + budget.wall_s))
    run.finish()
    if run.over:
        return {"error": run.over}
    if timed_out and _ran(run, budget, began):
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

KINDS = {"tests": run_tests, "stdio": run_stdio, "grader": run_grader, "session": run_session}


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
