"""The python environment's interpreter: a live session in the sandbox (``/v1/sessions``,
docs/services/sandbox.md), one per episode, and what its cells show the policy.

The episode keeps a handle (``Handle``: the session's id and the replica that holds it), not
its cells: a cell runs once, where the cells before it ran, and its cost is its own. The
handle lives in the episode's state (``store.Episode.tool_state``), so any replica of the
envs service, or a restarted one, reaches the same interpreter. The interpreter itself
lives in the sandbox's process: when it is gone (reaped after ``SANDBOX_SESSION_IDLE_S``
idle, or lost when the sandbox restarted) the sandbox answers 404 ``session_not_found``, and
the call says so in its observation (``LOST``): the code did not run, the handle is
dropped, and the next ``run`` opens a fresh interpreter. Deleting the episode closes its
interpreter (best effort: the idle reaping covers the rest).

All calls go out on the one aiohttp session of the envs service's component client, with
the team's header: the sandbox keeps each team's interpreters apart and counts them
(``SANDBOX_SESSION_PER_TEAM``: past it the call is a 429, retryable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import aiohttp

from arbiter.errors import ArbiterError, BadResponse, Timeout, Unavailable, from_response
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.sandbox import CellResult, SessionInfo

log = logging.getLogger("arbiter.envs")

WALL_FACTOR = 10  # the sandbox's wall-clock backstop of a cell: 10 x its CPU seconds + 1
LOST = (
    "[this episode's Python interpreter is gone (idle too long, or the sandbox restarted): "
    "the code did not run. Run it again: a fresh interpreter starts, without the earlier "
    "variables]"
)


@dataclass(frozen=True)
class Handle:
    """Where an episode's interpreter lives: its session id, and the base URL of the
    sandbox replica holding it ("" when that is the envs service's ENVS_SANDBOX_URL)."""

    id: str
    replica: str = ""

    @classmethod
    def of(cls, tool_state: dict[str, str]) -> Handle | None:
        session_id = tool_state.get("interpreter")
        return cls(session_id, tool_state.get("replica", "")) if session_id else None

    def dump(self) -> dict[str, str]:
        return {"interpreter": self.id, "replica": self.replica}


class Interpreters:
    """The sandbox's sessions API, for the python environment."""

    def __init__(
        self, http: aiohttp.ClientSession, sandbox_url: str, timeout_s: float, cpu_s: float
    ) -> None:
        self.http = http
        self.base = sandbox_url
        self.timeout_s = timeout_s  # opening and closing (ENVS_COMPONENT_TIMEOUT_S)
        self.cpu_s = cpu_s  # CPU seconds of a cell (ENVS_RUN_TIMEOUT_S)
        # a cell: its wait for a worker, then at most its wall-clock backstop and a grace
        self.run_timeout_s = timeout_s + WALL_FACTOR * math.ceil(cpu_s) + 3

    async def open(self, team: str) -> Handle:
        body = {"timeout_s": self.cpu_s}
        info = SessionInfo.model_validate(
            await self._call("POST", f"{self.base}/v1/sessions", team, body, self.timeout_s)
        )
        return Handle(info.id, info.replica or "")

    async def run(self, handle: Handle, team: str, code: str) -> CellResult | None:
        """The cell's result, or None when the interpreter is gone (``LOST``)."""
        url = f"{handle.replica or self.base}/v1/sessions/{handle.id}/run"
        try:
            answer = await self._call("POST", url, team, {"code": code}, self.run_timeout_s)
        except ArbiterError as exc:
            if exc.code == "session_not_found":
                return None
            if handle.replica and exc.code == "sandbox_unreachable":
                return None  # the replica that held it is gone (a pod's address, not reused)
            raise
        return CellResult.model_validate(answer)

    async def close(self, handle: Handle, team: str) -> None:
        """Best effort: an interpreter not closed here is reaped when idle."""
        url = f"{handle.replica or self.base}/v1/sessions/{handle.id}"
        try:
            await self._call("DELETE", url, team, None, self.timeout_s)
        except ArbiterError as exc:
            if exc.code != "session_not_found":
                log.info("interpreter %s not closed: %s", handle.id[:8], exc.message)

    async def _call(
        self, method: str, url: str, team: str, body: Any, timeout_s: float
    ) -> dict[str, Any]:
        try:
            async with (
                asyncio.timeout(timeout_s),
                self.http.request(method, url, json=body, headers={TEAM_HEADER: team}) as resp,
            ):
                status, content = resp.status, await resp.read()
        except TimeoutError:
            raise Timeout(f"python: the sandbox gave no answer within {timeout_s:g}s") from None
        except aiohttp.ClientConnectorError:
            raise Unavailable(
                "python: the sandbox is unreachable", code="sandbox_unreachable"
            ) from None
        except aiohttp.ClientError as exc:
            raise Unavailable(f"python: the sandbox failed ({type(exc).__name__})") from None
        if status != 200:
            raise from_response(status, content, source="sandbox")
        try:
            answer = json.loads(content)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise BadResponse("python: the sandbox answered outside its contract")
        return answer


def shown(cell: CellResult) -> str:
    """What the policy sees of a cell: its stdout, then its stderr (a traceback), each with
    how much was cut, then why it stopped when it did not end by itself."""
    parts = [cell.stdout]
    if cell.stdout_omitted:
        parts.append(f"[... {cell.stdout_omitted} more bytes of output not shown]")
    parts.append(cell.stderr)
    if cell.stderr_omitted:
        parts.append(f"[... {cell.stderr_omitted} more bytes of stderr not shown]")
    if cell.status == "interrupted":
        parts.append(f"[{cell.message}]")
    elif cell.status == "restarted":
        parts.append(
            f"[{cell.message}; the next run starts a fresh interpreter: variables from "
            "earlier runs are gone]"
        )
    text = ""
    for part in parts:
        if part and text and not text.endswith("\n"):
            text += "\n"
        text += part
    return text
