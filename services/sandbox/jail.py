"""The bubblewrap sandboxes, started ahead of need.

One sandbox runs one job and exits: ``bwrap`` puts the harness (``harness.py`` and
``runners.py``) in new user, PID, network, IPC, UTS and cgroup namespaces, with a
read-only view of the interpreter (``/usr``, the ``/lib*`` links, the interpreter's own
prefix when it lives elsewhere, its site-packages hidden under empty tmpfs), a fresh
``/tmp`` tmpfs of ``SANDBOX_TMP_MB`` (the only writable place: ``/`` and ``/dev`` are
remounted read-only), a minimal ``/dev`` and no ``/proc``; no
environment (``--clearenv``), no network (a new network namespace: only its own
loopback), no new user namespaces inside, a new session (no terminal to push input into),
``--die-with-parent``, and the seccomp filter of ``seccomp.py``. Run as root, the service
starts it as ``SANDBOX_UID`` (nobody): the kernel enforces ``RLIMIT_NPROC`` only on a user
other than root, and the count is per user namespace, so each sandbox has its own.

Starting one costs ~10 ms of CPU (bwrap ~4 ms, the interpreter ~6 ms); ``Pool`` keeps
``workers + spare`` of them started, each waiting on its stdin, and replaces each one
taken in the background, so a job pays none of it. A job writes the job (marshal) to the
harness's stdin and reads one JSON line back; past its deadline (the harness keeps its
own; this is the backstop) the process group is killed, which takes the namespace.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
import marshal
import os
import platform
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.sandbox.seccomp import seccomp_filter
from arbiter.services.sandbox.settings import SandboxSettings

log = logging.getLogger("arbiter.sandbox")
FAILURES_LOG = ThrottledLog(log)

SANDBOXES_STARTED = Counter("sandbox_started_total", "Sandboxes started (one per job).")
SANDBOX_FAILURES = Counter(
    "sandbox_failures_total", "Sandboxes that failed on their own account, by stage.", ["stage"]
)
SANDBOXES_IDLE = Gauge("sandbox_idle", "Sandboxes started and waiting for a job.")


def _one_program() -> str:
    """``harness.py`` then ``runners.py`` as one source: the runners' ``__future__`` import
    and their import of the harness (for tools and tests) dropped, the rest as written."""
    here = Path(__file__).parent
    runners = (here / "runners.py").read_text()
    lines = runners.split("\n")
    for node in ast.parse(runners).body:
        if isinstance(node, ast.ImportFrom) and node.module in (
            "__future__",
            __package__ + ".harness",
        ):
            end = node.end_lineno or node.lineno
            lines[node.lineno - 1 : end] = [""] * (end - node.lineno + 1)
    return (here / "harness.py").read_text() + "\n" + "\n".join(lines)


HARNESS = _one_program()
# What the interpreter runs: the harness's code object, compiled once at start-up by the same
# interpreter (compiling its source took ~6 ms of every sandbox's start), read from stdin as
# a length line and the marshalled code; the job follows on the same stdin.
BOOT = (
    "import marshal,sys;b=sys.stdin.buffer;"
    "exec(marshal.loads(b.read(int(b.readline()))),{'__name__':'__main__'})"
)
COMPILE = (
    "import marshal,sys;"
    "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(),'harness','exec')))"
)
READY_TIMEOUT_S = 10.0
ANSWER_LIMIT = 4 << 20  # bytes of the harness's answer line
STDERR_LIMIT = 8192  # of the harness's own stderr, kept for the log
RETIRE_S = 5.0  # an answered sandbox exits by itself within this, or is killed
RETIRING: set[asyncio.Task[None]] = set()  # answered sandboxes not yet exited


class SandboxFailure(Exception):
    """The sandbox itself failed (could not start, or died without answering): not the
    program's doing."""


def interpreter_paths(python: str) -> tuple[str, str, list[str]]:
    """(the interpreter's real path, its prefix, its site-packages dirs), asked of it."""
    code = (
        "import json, site, sys, sysconfig; p = sysconfig.get_paths(); "
        "print(json.dumps([sys.executable, sys.base_prefix, "
        "sorted({p['purelib'], p['platlib'], *site.getsitepackages()})]))"
    )
    out = subprocess.run(
        [python, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    exe, prefix, sites = json.loads(out)
    return os.path.realpath(exe), os.path.realpath(prefix), sites


def bwrap_argv(settings: SandboxSettings) -> list[str]:
    """The whole command line of one sandbox."""
    exe, prefix, sites = interpreter_paths(settings.python)
    argv = [
        settings.bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--as-pid-1",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(top), top]
        elif path.is_dir():
            argv += ["--ro-bind", top, top]
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    for site in sites:  # the service's own packages (and anything else installed) hidden
        if Path(site).is_dir():
            argv += ["--tmpfs", site, "--remount-ro", site]
    argv += ["--size", str(settings.tmp_mb << 20), "--tmpfs", "/tmp"]
    # no /proc: nothing there a program needs, and the runner's memory and fds (/proc/1/mem,
    # /proc/1/fd) stay out of reach without making it undumpable (ctypes: ~3 ms a sandbox)
    argv += ["--dev", "/dev", "--chdir", "/tmp"]
    # / and /dev are bwrap's own tmpfs, writable and unbounded unless made read-only: only
    # /tmp (bounded by --size) takes writes
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    argv += ["--setenv", "LANG", "C.UTF-8"]
    return [*argv, "--", exe, "-I", "-S", "-c", BOOT]


def compiled_harness(python: str) -> bytes:
    """The harness compiled by ``python`` (code objects are specific to its version), as
    ``Sandbox`` sends it: a length line, then the marshalled code."""
    code = subprocess.run(  # the configured interpreter, a fixed script
        [python, "-I", "-S", "-c", COMPILE],
        input=HARNESS.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    return b"%d\n" % len(code) + code


def setpriv(settings: SandboxSettings) -> list[str]:
    """``setpriv`` (util-linux) switching to ``SANDBOX_UID``/``GID`` with no other groups."""
    found = shutil.which("setpriv")
    if found is None:
        raise RuntimeError(
            "the sandbox service runs as root and needs setpriv (Debian: util-linux) to run "
            "programs as SANDBOX_UID; install it or run the service as another user"
        )
    uid, gid = settings.uid, settings.gid
    return [found, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


class Sandbox:
    """One started sandbox, waiting for its one job."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def boot(self, harness: bytes) -> None:
        """Hand the interpreter its harness; wait for the harness to say it is ready."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(harness)
            await self.proc.stdin.drain()
        except (ConnectionError, OSError):
            pass  # it died already: the readiness line below says so
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.strip() != b'{"ready": true}':
            detail = await self._stderr()
            self.kill()
            raise SandboxFailure(f"the sandbox did not start: {detail or 'no reason given'}")

    async def run(self, job: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """Send ``job``; its answer, or ``SandboxFailure``. After an answer the sandbox exits
        by itself (``_retire``: bwrap then reaps the harness, so their CPU time is counted);
        any other way out kills it."""
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(deadline_s):
                proc.stdin.write(marshal.dumps(job))  # read by the harness, no json to import
                await proc.stdin.drain()
                proc.stdin.close()
                line = await proc.stdout.readline()
        except TimeoutError:
            self.kill()
            SANDBOX_FAILURES.labels("deadline").inc()
            raise SandboxFailure(f"the sandbox gave no answer within {deadline_s:g}s") from None
        except (ConnectionError, ValueError, asyncio.LimitOverrunError) as exc:
            self.kill()
            SANDBOX_FAILURES.labels("io").inc()
            raise SandboxFailure(f"the sandbox failed ({type(exc).__name__})") from None
        except BaseException:  # cancelled: its caller left
            self.kill()
            raise
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            SANDBOX_FAILURES.labels("answer").inc()
            detail = await self._stderr()
            FAILURES_LOG.error("answer", "sandbox died without an answer: %s", detail)
            raise SandboxFailure("the sandbox died without an answer")
        task = asyncio.create_task(self._retire())
        RETIRING.add(task)
        task.add_done_callback(RETIRING.discard)
        return answer

    async def _retire(self) -> None:
        """Wait for the answered sandbox to exit; kill it if it has not after ``RETIRE_S``."""
        try:
            await asyncio.wait_for(self.proc.wait(), RETIRE_S)
        except TimeoutError:
            SANDBOX_FAILURES.labels("exit").inc()
        finally:
            self.kill()

    async def _stderr(self) -> str:
        if self.proc.stderr is None:
            return ""
        with contextlib.suppress(TimeoutError, ValueError):
            data = await asyncio.wait_for(self.proc.stderr.read(STDERR_LIMIT), 1.0)
            return data.decode("utf-8", "replace").strip()[-500:]
        return ""

    def kill(self) -> None:
        """Kill the sandbox's process group (bwrap; its PID namespace dies with it)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class Pool:
    """``size`` sandboxes kept started; ``take`` hands one out and its replacement starts.

    Replacements start concurrently (one task each): started one after another, the pool
    could not hand out more than one sandbox per start-up time (~50 ms), whatever the
    cores."""

    def __init__(self, settings: SandboxSettings, size: int) -> None:
        self.settings = settings
        self.size = size
        self.argv = bwrap_argv(settings)
        self.harness = compiled_harness(settings.python)
        self.seccomp = seccomp_filter()
        if self.seccomp is None:
            log.warning("no seccomp filter for %s: sandboxes run without one", platform.machine())
        self._bwrap_at = 0  # where the bwrap binary is in argv
        if os.geteuid() == 0:  # never run untrusted code as root: drop to SANDBOX_UID first
            prefix = setpriv(settings)
            self.argv, self._bwrap_at = [*prefix, *self.argv], len(prefix)
        self._ready: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._starting: set[asyncio.Task[None]] = set()
        self._closed = False
        self.last_error = ""

    async def start(self) -> None:
        """One sandbox started and checked now (a broken setup fails the service's start),
        the rest in the background."""
        self._ready.put_nowait(await self.spawn())
        self._refill()

    async def close(self) -> None:
        self._closed = True
        for task in [*self._starting, *RETIRING]:  # answered ones are killed as they go
            task.cancel()
        await asyncio.gather(*self._starting, *RETIRING, return_exceptions=True)
        while not self._ready.empty():
            box = self._ready.get_nowait()
            box.kill()
            with contextlib.suppress(Exception):
                await box.proc.wait()
        SANDBOXES_IDLE.set(0)

    @property
    def idle(self) -> int:
        return self._ready.qsize()

    async def spawn(self) -> Sandbox:
        argv, fds = self.argv, []
        if self.seccomp is not None:  # bwrap reads the filter from a pipe of its own
            read, write = os.pipe()
            os.write(write, self.seccomp)  # a few hundred bytes: within the pipe's buffer
            os.close(write)
            fds = [read]
            at = self._bwrap_at + 1  # its options right after the bwrap binary
            argv = [*argv[:at], "--seccomp", str(read), *argv[at:]]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: one killpg ends it
                limit=ANSWER_LIMIT,
                cwd="/",
                env={},
                pass_fds=fds,
            )
        except OSError as exc:
            SANDBOX_FAILURES.labels("spawn").inc()
            self.last_error = f"cannot start bwrap: {exc}"
            raise SandboxFailure(self.last_error) from None
        finally:
            for fd in fds:
                os.close(fd)
        SANDBOXES_STARTED.inc()
        box = Sandbox(proc)
        try:
            await box.boot(self.harness)
        except SandboxFailure as exc:
            SANDBOX_FAILURES.labels("start").inc()
            self.last_error = str(exc)
            raise
        self.last_error = ""
        return box

    async def take(self) -> Sandbox:
        """A started sandbox: a waiting one, else the next to finish starting."""
        while True:
            self._refill()
            try:
                box = await asyncio.wait_for(self._ready.get(), READY_TIMEOUT_S)
            except TimeoutError:
                raise SandboxFailure(
                    f"no sandbox started within {READY_TIMEOUT_S:g}s: "
                    f"{self.last_error or 'the host is overloaded'}"
                ) from None
            SANDBOXES_IDLE.set(self._ready.qsize())
            if box.alive:
                self._refill()
                return box

    def _refill(self) -> None:
        """Start as many sandboxes as are missing from ``size``, each in its own task."""
        while not self._closed and self._ready.qsize() + len(self._starting) < self.size:
            task = asyncio.create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        try:
            box = await self.spawn()
        except SandboxFailure as exc:
            FAILURES_LOG.error("spawn", "sandbox start failed: %s", exc)
            await asyncio.sleep(1.0)  # then the next take or refill tries again
            return
        self._ready.put_nowait(box)
        SANDBOXES_IDLE.set(self._ready.qsize())
