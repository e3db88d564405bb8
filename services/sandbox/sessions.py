"""Live Python interpreters (sessions): one per episode of the envs service's ``python``
tool, each in a sandbox of its own. Importable without FastAPI; built once at start-up
(``app.state.sessions``).

A session is a bwrap sandbox started for it alone (``jail.Pool.spawn``: the command line,
seccomp filter and user of every other sandbox) whose zygote runs one job of kind
``session`` (``injail/session.py``): fresh namespaces and ``/tmp``, every capability
dropped, no network, ``SANDBOX_SESSION_MEMORY_MB`` shared among
``SANDBOX_SESSION_MAX_PROCESSES`` processes (``memory.py``). The job's PID 1 keeps the
interpreter and answers one frame per cell over a unix socket whose other end is held here:
a 4-byte length, then the cell marshalled (ours), or the answer as JSON (PID 1's, built from
what it read of the interpreter's pipes and the kernel's CPU count; nothing a cell prints is
a frame). Closing a session kills its sandbox, and everything in it.

Bounds: ``SANDBOX_SESSION_MAX`` sessions at once, ``SANDBOX_SESSION_PER_TEAM`` of one team
(past it, 429 for that team alone); a session without a cell for ``SANDBOX_SESSION_IDLE_S``
is closed by the reaper. A running cell holds a worker slot in the fair share that
``code_tests`` programs use (``Runner.slots``), so cells and scoring share
``SANDBOX_WORKERS`` by team. One cell at a time per session: another sent meanwhile is 409
``session_busy``. A cell whose caller leaves kills its session, as a scoring request's
programs are killed.

Sessions live in this process: a restart loses them. Their ids then answer 404
``session_not_found``, as a closed or reaped one does; the caller opens a new one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import marshal
import math
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from arbiter.errors import Conflict, NotFound, RateLimited, Timeout, Unavailable
from arbiter.proto.sandbox import CellResult, OpenSession, SessionInfo
from arbiter.services.common.fairness import FairLimiter
from arbiter.services.sandbox.injail.harness import WALL_FACTOR
from arbiter.services.sandbox.jail import Pool, Sandbox, SandboxFailure, job_bytes
from arbiter.services.sandbox.memory import job_limits
from arbiter.services.sandbox.settings import SandboxSettings

log = logging.getLogger("arbiter.sandbox")

SESSIONS_LIVE = Gauge("sandbox_sessions_live", "Live Python interpreters (sessions).")
SESSIONS = Counter(
    "sandbox_sessions_total",
    "Sessions by event: opened, refused (a cap), closed, reaped (idle), failed.",
    ["event"],
)
CELLS = Counter("sandbox_session_cells_total", "Cells run in sessions, by status.", ["status"])
SESSION_CPU = Counter("sandbox_session_cpu_seconds_total", "CPU time the sessions used.")

READY_S = 10.0  # a session's PID 1 says it is ready within this
SLACK_S = 5.0  # over a cell's own clocks (the backstop and its grace), for PID 1 to answer
GRACE_S = 1.0  # PID 1's grace after the wall-clock interrupt (session.SESSION_GRACE_S)


@dataclass(eq=False)
class Session:
    id: str
    team: str
    box: Sandbox
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    timeout_s: float  # CPU seconds of a cell, whole
    used: float  # monotonic time of its last cell's end (or its opening)
    busy: bool = False
    closed: bool = False


class Sessions:
    def __init__(self, settings: SandboxSettings, pool: Pool, slots: FairLimiter) -> None:
        self.settings = settings
        self.pool = pool
        self.slots = slots
        # an answer holds two streams of session_output_bytes, each at most 6 bytes a byte
        self.frame_max = 12 * settings.session_output_bytes + 65536
        self._live: dict[str, Session] = {}
        self._teams: dict[str, int] = {}  # sessions live or opening, by team
        self._opening = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session in list(self._live.values()):
            self._end(session, "closed")
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def held_by(self, team: str) -> int:
        return self._teams.get(team, 0)

    # ------------------------------------------------------------------ open

    async def open(self, team: str, req: OpenSession) -> SessionInfo:
        s = self.settings
        if len(self._live) + self._opening >= s.session_max:
            SESSIONS.labels("refused").inc()
            raise Unavailable(
                f"{s.session_max} live interpreters already, the most this sandbox holds "
                "(SANDBOX_SESSION_MAX); retry once one is closed",
                code="sessions_full",
            )
        if self.held_by(team) >= s.session_per_team:
            SESSIONS.labels("refused").inc()
            raise RateLimited(
                f"this team has {self.held_by(team)} live interpreters, its most "
                "(SANDBOX_SESSION_PER_TEAM): close one (delete its episode) or let one idle "
                f"out ({s.session_idle_s:g} s)",
                code="session_limit",
            )
        cpu_s = max(1, math.ceil(min(req.timeout_s, s.test_timeout_s)))
        self._opening += 1
        self._teams[team] = self.held_by(team) + 1
        try:
            session = await self._start(team, cpu_s)
        except BaseException:
            self._forget_team(team)
            raise
        finally:
            self._opening -= 1
        self._live[session.id] = session
        SESSIONS.labels("opened").inc()
        SESSIONS_LIVE.set(len(self._live))
        return SessionInfo(
            id=session.id, replica=s.session_url, timeout_s=cpu_s, idle_timeout_s=s.session_idle_s
        )

    async def _start(self, team: str, cpu_s: int) -> Session:
        try:
            box = await self.pool.spawn()
        except SandboxFailure as exc:
            SESSIONS.labels("failed").inc()
            raise Unavailable(
                f"no sandbox for the interpreter: {exc}", code="sandbox_error"
            ) from None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fd = os.memfd_create("job", os.MFD_CLOEXEC)  # the job's PID 1 reads it
            try:
                os.write(fd, job_bytes(self._job(cpu_s)))
                os.lseek(fd, 0, os.SEEK_SET)
                socket.send_fds(box.control, [self.pool.tmpfs], [fd, theirs.fileno()])
            finally:
                os.close(fd)
                theirs.close()
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            ready = await asyncio.wait_for(read_frame(reader, self.frame_max), READY_S)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
            box.kill()
            ours.close()
            SESSIONS.labels("failed").inc()
            raise Unavailable(
                f"the interpreter's sandbox did not start ({type(exc).__name__})",
                code="sandbox_error",
            ) from None
        if ready.get("ready") is not True:
            box.kill()
            writer.close()
            SESSIONS.labels("failed").inc()
            raise Unavailable(f"the interpreter did not start: {ready.get('error')}"[:500])
        session_id = secrets.token_urlsafe(18)
        return Session(session_id, team, box, reader, writer, cpu_s, time.monotonic())

    def _job(self, cpu_s: int) -> dict[str, Any]:
        s = self.settings
        limits = {
            "memory_mb": s.session_memory_mb,
            "processes": s.session_max_processes,
            "file_mb": s.max_file_mb,
            "open_files": s.max_open_files,
            "nice": s.nice,
        }
        return {
            "kind": "session",
            "timeout_s": cpu_s,
            "output_bytes": s.session_output_bytes,
            "limits": job_limits(
                limits, "session", s.session_memory_mb, s.session_max_processes, s.tmp_mb
            ),
            "no_dump": self.pool.seccomp is None,
            # what the harness's Budget reads; a session's own clocks are per cell
            "item_timeout_s": s.item_timeout_s,
            "output_limit": s.output_limit_bytes,
        }

    # ------------------------------------------------------------------ run, close

    async def run(self, team: str, session_id: str, code: str) -> CellResult:
        session = self._get(team, session_id)
        if session.busy:
            raise Conflict(
                "a cell of this session is still running: one at a time",
                param="session_id",
                code="session_busy",
            )
        session.busy = True
        queue_s = self.settings.queue_timeout_s
        try:
            async with asyncio.timeout(queue_s) as waiting:
                async with self.slots.slot(session, team):
                    waiting.reschedule(None)  # running: the cell's own clocks hold
                    return await self._cell(session, code)
        except TimeoutError:
            raise Timeout(
                f"no sandbox worker free within {queue_s:g}s", code="queue_timeout"
            ) from None
        finally:
            session.busy = False
            session.used = time.monotonic()

    async def _cell(self, session: Session, code: str) -> CellResult:
        deadline = WALL_FACTOR * session.timeout_s + 1 + GRACE_S + SLACK_S
        try:
            async with asyncio.timeout(deadline):
                body = marshal.dumps({"code": code})
                session.writer.write(len(body).to_bytes(4, "big") + body)
                await session.writer.drain()
                answer = await read_frame(session.reader, self.frame_max)
        except BaseException as exc:
            closed = session.closed  # by DELETE, or the reaper, while the cell ran
            self._end(session, "closed" if closed else "failed")
            if isinstance(exc, asyncio.CancelledError):
                raise
            if closed:
                raise self._not_found(session.id) from None
            log.warning("session %s failed: %s", session.id[:8], type(exc).__name__)
            raise Unavailable(
                "the interpreter's sandbox failed; this session is closed: open a new one",
                code="session_failed",
            ) from None
        try:
            cpu_s = float(answer["cpu_s"])
            result = CellResult(
                status=answer["status"],
                stdout=answer["stdout"],
                stderr=answer["stderr"],
                stdout_omitted=answer["stdout_omitted"],
                stderr_omitted=answer["stderr_omitted"],
                cpu_ms=round(cpu_s * 1000, 3),
                message=answer.get("message") or "",
            )
        except (KeyError, TypeError, ValueError):  # not what PID 1 writes: the sandbox is broken
            self._end(session, "failed")
            raise Unavailable(
                "the interpreter's sandbox answered out of its protocol; this session is "
                "closed: open a new one",
                code="session_failed",
            ) from None
        SESSION_CPU.inc(cpu_s)
        CELLS.labels(result.status).inc()
        return result

    def close_session(self, team: str, session_id: str) -> None:
        self._end(self._get(team, session_id), "closed")

    def _get(self, team: str, session_id: str) -> Session:
        session = self._live.get(session_id)
        if session is None or session.team != team:  # another team's id is unknown too
            raise self._not_found(session_id)
        return session

    def _not_found(self, session_id: str) -> NotFound:
        return NotFound(
            f"session_id: no live interpreter {session_id[:64]!r} (never opened, closed, "
            f"reaped after {self.settings.session_idle_s:g} s idle, or lost when the sandbox "
            "restarted); open a new one",
            param="session_id",
            code="session_not_found",
        )

    def _end(self, session: Session, event: str) -> None:
        if self._live.pop(session.id, None) is not None:
            self._forget_team(session.team)
            SESSIONS.labels(event).inc()
            SESSIONS_LIVE.set(len(self._live))
        session.closed = True
        session.box.kill()
        session.writer.close()
        task = asyncio.create_task(session.box.proc.wait())  # reaped, its pipes closed
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget_team(self, team: str) -> None:
        left = self.held_by(team) - 1
        if left > 0:
            self._teams[team] = left
        else:
            self._teams.pop(team, None)

    async def _reap_idle(self) -> None:
        """Close every session idle past ``SANDBOX_SESSION_IDLE_S``, and any whose sandbox
        died on its own."""
        idle_s = self.settings.session_idle_s
        while True:
            await asyncio.sleep(min(5.0, idle_s / 4))
            now = time.monotonic()
            for session in list(self._live.values()):
                if session.box.proc.returncode is not None:
                    self._end(session, "failed")
                elif not session.busy and now - session.used > idle_s:
                    self._end(session, "reaped")


async def read_frame(reader: asyncio.StreamReader, limit: int) -> dict[str, Any]:
    """One of PID 1's frames: a 4-byte length, then a JSON object."""
    n = int.from_bytes(await reader.readexactly(4), "big")
    if n > limit:
        raise ValueError(f"a frame of {n} bytes")
    value = json.loads(await reader.readexactly(n))
    if not isinstance(value, dict):
        raise ValueError("a frame that is not an object")
    return value
