"""The bubblewrap sandboxes: zygotes started ahead of need, one job at a time each.

A sandbox is ``bwrap`` (its command line: ``bwrap.py``) running the harness (the modules of
``injail/``, joined into one program) in new user, PID, network, IPC, UTS and
cgroup namespaces, with a read-only view of the interpreter, ``/`` and a minimal ``/dev``
read-only, no ``/proc``, no environment, no new user namespaces inside, a new session,
``--die-with-parent`` and the seccomp filter of ``seccomp.py``. Its zygote keeps
``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN`` of its own user namespace and runs each job in fresh
mount, PID, IPC and network namespaces with a fresh ``/tmp`` (``SANDBOX_TMP_MB``,
``SANDBOX_TMP_INODES``) and ptys of its own, under a PID 1 that drops every capability first
(``zygote.serve``). Run as root, the service starts it as ``SANDBOX_UID`` (nobody): the
kernel enforces ``RLIMIT_NPROC`` only on a user other than root.

Starting a sandbox costs ~12 ms of CPU (bwrap, the interpreter); a job in a started one
~2.5 ms. ``Pool`` keeps ``workers + spare`` started; a job takes a free one, sends it the
job as a file descriptor (a memfd: the zygote never reads it), reads one JSON line back,
and returns it to the pool once the zygote reports the job's namespace gone. Past its
deadline (the harness keeps its own; this is the backstop), or when its caller leaves, the
whole sandbox is killed and a new one starts in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import marshal
import os
import platform
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from prometheus_client import Counter, Gauge

from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.sandbox.bwrap import bwrap_argv, compiled_harness, setpriv
from arbiter.services.sandbox.memory import job_limits
from arbiter.services.sandbox.seccomp import seccomp_filter
from arbiter.services.sandbox.settings import SandboxSettings

log = logging.getLogger("arbiter.sandbox")
FAILURES_LOG = ThrottledLog(log)

SANDBOXES_STARTED = Counter("sandbox_started_total", "Sandboxes (zygotes) started.")
SANDBOX_FAILURES = Counter(
    "sandbox_failures_total", "Sandboxes that failed on their own account, by stage.", ["stage"]
)
SANDBOXES_IDLE = Gauge("sandbox_idle", "Sandboxes started and free for a job.")
JOBS = Counter("sandbox_jobs_total", "Jobs sent to sandboxes (one per response).")


READY_TIMEOUT_S = 10.0
ANSWER_LIMIT = 4 << 20  # bytes of the harness's answer line, at least
ANSWER_PER_TEST = 2048  # and per test: a reason is at most ~1.2 KB (harness.cut)
STDERR_LIMIT = 8192  # of the harness's own stderr, kept for the log
RETIRE_S = 5.0  # an answered job's namespace is gone within this, or the sandbox is killed


class SandboxFailure(Exception):
    """The sandbox itself failed (could not start, or died without answering): not the
    program's doing."""


def job_bytes(job: dict[str, Any]) -> bytes:
    """What the job's memfd holds: a length line, the marshalled job without its
    ``secret`` (no json to import in the sandbox), then the marshalled secret (a Python-tests
    job's tests), which only the checker reads (``zygote.read_job``, ``checker.py``)."""
    head = marshal.dumps({k: v for k, v in job.items() if k != "secret"})
    return b"%d\n" % len(head) + head + marshal.dumps(job.get("secret"))


class Sandbox:
    """One started sandbox (a zygote), free or running one job."""

    def __init__(self, proc: asyncio.subprocess.Process, control: socket.socket) -> None:
        self.proc = proc
        self.control = control  # our end of its stdin
        self.killed = False
        self.pending = False  # an answer was read; the zygote's "#exit" line not yet

    @property
    def alive(self) -> bool:
        return not self.killed and self.proc.returncode is None

    async def boot(self, harness: bytes) -> None:
        """Hand the interpreter its harness; wait for the harness to say it is ready."""
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):  # it died already: the readiness line says so
            await loop.sock_sendall(self.control, harness)
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.strip() != b'{"ready": true}':
            detail = await self._stderr()
            self.kill()
            raise SandboxFailure(f"the sandbox did not start: {detail or 'no reason given'}")

    async def run(self, job: dict[str, Any], deadline_s: float, tmpfs: bytes) -> dict[str, Any]:
        """Send ``job``; its answer, or ``SandboxFailure``. After an answer, ``settle`` waits
        for the zygote to be free again; a job the sandbox failed leaves it free too (a
        ``#exit`` line came instead of an answer), any other way out kills it."""
        proc = self.proc
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(deadline_s):
                JOBS.inc()
                fd = os.memfd_create("job", os.MFD_CLOEXEC)  # the job's PID 1 reads it
                try:
                    os.write(fd, job_bytes(job))
                    os.lseek(fd, 0, os.SEEK_SET)
                    socket.send_fds(self.control, [tmpfs], [fd])
                finally:
                    os.close(fd)
                line = await proc.stdout.readline()
        except TimeoutError:
            self.kill()
            SANDBOX_FAILURES.labels("deadline").inc()
            raise SandboxFailure(f"the sandbox gave no answer within {deadline_s:g}s") from None
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            self.kill()
            SANDBOX_FAILURES.labels("io").inc()
            raise SandboxFailure(f"the sandbox failed ({type(exc).__name__})") from None
        except BaseException:  # cancelled: its caller left
            self.kill()
            raise
        if line.startswith(b"#exit "):  # the job's PID 1 died without an answer
            SANDBOX_FAILURES.labels("answer").inc()
            detail = await self._stderr()
            FAILURES_LOG.error("answer", "sandbox job died without an answer: %s", detail)
            raise SandboxFailure("the sandbox died without an answer")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # the zygote died, or wrote what no harness writes
            self.kill()
            SANDBOX_FAILURES.labels("answer").inc()
            detail = await self._stderr()
            FAILURES_LOG.error("answer", "sandbox died without an answer: %s", detail)
            raise SandboxFailure("the sandbox died without an answer")
        self.pending = True
        if "sandbox_error" in answer:  # the job's namespaces could not be made
            SANDBOX_FAILURES.labels("start").inc()
            raise SandboxFailure(str(answer["sandbox_error"])[:500])
        return answer

    async def settle(self) -> bool:
        """After an answer: wait for the zygote's ``#exit`` line (the job's namespace gone);
        True when it is free for the next job. One that does not say so is killed."""
        if not self.alive:
            return False
        if self.pending:
            assert self.proc.stdout is not None
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), RETIRE_S)
            except (TimeoutError, ValueError, asyncio.LimitOverrunError):
                line = b""
            self.pending = False
            if not line.startswith(b"#exit "):
                SANDBOX_FAILURES.labels("exit").inc()
                self.kill()
                return False
        return self.alive

    async def _stderr(self) -> str:
        if self.proc.stderr is None:
            return ""
        with contextlib.suppress(TimeoutError, ValueError):
            data = await asyncio.wait_for(self.proc.stderr.read(STDERR_LIMIT), 0.2)
            return data.decode("utf-8", "replace").strip()[-500:]
        return ""

    def kill(self) -> None:
        """Kill the sandbox's process group (bwrap; its PID namespace dies with it)."""
        self.killed = True
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.control.close()


class Pool:
    """``size`` sandboxes kept started; a job takes a free one and gives it back when done.

    Sandboxes start concurrently (one task each): started one after another, the pool
    could not replace more than one per start-up time (~50 ms), whatever the cores."""

    def __init__(self, settings: SandboxSettings, size: int) -> None:
        self.settings = settings
        self.size = size
        self.argv = bwrap_argv(settings)
        self.harness = compiled_harness(settings.python)
        self.tmpfs = b"size=%d,nr_inodes=%d" % (settings.tmp_mb << 20, settings.tmp_inodes)
        self.seccomp = seccomp_filter()
        if self.seccomp is None:
            log.warning("no seccomp filter for %s: sandboxes run without one", platform.machine())
        self._bwrap_at = 0  # where the bwrap binary is in argv
        if os.geteuid() == 0:  # never run untrusted code as root: drop to SANDBOX_UID first
            prefix = setpriv(settings)
            self.argv, self._bwrap_at = [*prefix, *self.argv], len(prefix)
        self._free: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._live: set[Sandbox] = set()  # started and not killed: free, busy or settling
        self._tasks: set[asyncio.Task[None]] = set()  # starting or settling
        self._starting = 0
        self._closed = False
        self.last_error = ""

    async def start(self) -> None:
        """One sandbox started and checked now (a broken setup fails the service's start),
        the rest in the background."""
        self._add(await self.spawn())
        self._refill()

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for box in self._live:
            box.kill()
        for box in self._live:
            with contextlib.suppress(Exception):
                await box.proc.wait()
        self._live.clear()
        SANDBOXES_IDLE.set(0)

    @property
    def idle(self) -> int:
        return self._free.qsize()

    async def spawn(self) -> Sandbox:
        argv, fds = self.argv, []
        if self.seccomp is not None:  # bwrap reads the filter from a pipe of its own
            read, write = os.pipe()
            os.write(write, self.seccomp)  # a few hundred bytes: within the pipe's buffer
            os.close(write)
            fds = [read]
            at = self._bwrap_at + 1  # its options right after the bwrap binary
            argv = [*argv[:at], "--seccomp", str(read), *argv[at:]]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=theirs.fileno(),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: one killpg ends it
                limit=max(ANSWER_LIMIT, ANSWER_PER_TEST * self.settings.max_tests),
                cwd="/",
                env={},
                pass_fds=fds,
            )
        except OSError as exc:
            ours.close()
            SANDBOX_FAILURES.labels("spawn").inc()
            self.last_error = f"cannot start bwrap: {exc}"
            raise SandboxFailure(self.last_error) from None
        finally:
            theirs.close()
            for fd in fds:
                os.close(fd)
        ours.setblocking(False)
        SANDBOXES_STARTED.inc()
        box = Sandbox(proc, ours)
        try:
            await box.boot(self.harness)
        except SandboxFailure as exc:
            SANDBOX_FAILURES.labels("start").inc()
            self.last_error = str(exc)
            raise
        self.last_error = ""
        return box

    async def run(self, job: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """``job``'s answer from a free sandbox, or ``SandboxFailure``. Its memory and
        process limits are the sandbox's for its kind, shared out by ``memory.job_limits``."""
        job = {**job, "limits": self.limits(job)}
        box = await self._take()
        try:
            return await box.run(job, deadline_s, self.tmpfs)
        finally:
            self._give_back(box)

    def limits(self, job: dict[str, Any]) -> dict[str, Any]:
        s, kind = self.settings, job["kind"]
        grader = kind == "grader"
        return job_limits(
            job["limits"],
            kind,
            s.grader_memory_mb if grader else s.memory_mb,
            s.grader_max_processes if grader else s.max_processes,
            s.tmp_mb,
        )

    async def _take(self) -> Sandbox:
        """A free sandbox: a waiting one, else the next to start or to settle."""
        while True:
            self._refill()
            try:
                box = await asyncio.wait_for(self._free.get(), READY_TIMEOUT_S)
            except TimeoutError:
                raise SandboxFailure(
                    f"no sandbox started within {READY_TIMEOUT_S:g}s: "
                    f"{self.last_error or 'the host is overloaded'}"
                ) from None
            SANDBOXES_IDLE.set(self._free.qsize())
            if box.alive:
                return box
            self._live.discard(box)

    def _give_back(self, box: Sandbox) -> None:
        if box.alive and box.pending:
            self._task(self._settle(box))
        elif box.alive and not self._closed:
            self._free.put_nowait(box)
        else:
            self._live.discard(box)
            box.kill()
            self._refill()

    async def _settle(self, box: Sandbox) -> None:
        free = await box.settle()
        self._give_back(box) if free else self._drop(box)

    def _drop(self, box: Sandbox) -> None:
        box.kill()
        self._live.discard(box)
        self._refill()

    def _add(self, box: Sandbox) -> None:
        self._live.add(box)
        self._free.put_nowait(box)
        SANDBOXES_IDLE.set(self._free.qsize())

    def _task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refill(self) -> None:
        """Start as many sandboxes as are missing from ``size``, each in its own task."""
        while not self._closed and len(self._live) + self._starting < self.size:
            self._starting += 1
            self._task(self._start_one())

    async def _start_one(self) -> None:
        try:
            box = await self.spawn()
        except SandboxFailure as exc:
            FAILURES_LOG.error("spawn", "sandbox start failed: %s", exc)
            await asyncio.sleep(1.0)  # then the next take or refill tries again
            return
        finally:
            self._starting -= 1
        if self._closed:
            box.kill()
        else:
            self._add(box)
