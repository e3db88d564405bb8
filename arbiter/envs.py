"""Python client for the environments: multi-turn episodes over the Open Reward Standard.

    from arbiter.envs import EnvsClient

    with EnvsClient() as envs:                       # ARBITER_URL, ARBITER_API_KEY
        task = envs.tasks("calculator", "test")[0]
        with envs.session("calculator", task) as episode:
            episode.prompt()                         # [TextBlock(text="…")]
            out = episode.call("calculate", expression="48 / 2 + 48")
            out = episode.call("submit", answer="72")
            out.reward, out.finished, out.metadata   # 1.0, True, {"components": …}

``AsyncEnvsClient`` is the same with ``await`` (``async with envs.session(…)``). Both talk
to the gateway's ``/ors`` (any ORS server: ``prefix=""`` for one at the root) through
``arbiter.client.ArbiterClient``'s pools and its one retry policy (``arbiter.retry``):
429 (honouring ``Retry-After``), 503, 504 and connection failures are retried, and every
POST carries one ``Idempotency-Key``, the same on each of its retries, so a retried tool
call is answered from the first try's answer instead of running twice.

A tool's answer is the ORS ``ToolOutput`` (``reward`` is None until the episode's reward
is computed; ``metadata`` holds its breakdown). A tool call the environment refused (an
unknown tool, bad input, an episode already finished) raises ``ToolRefused`` (422, not
retried); an error the server reports inside the SSE body raises ``Unavailable``, and a
call that did not answer (the stream's ``: arbiter-error`` comment) the error it reports.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx
from pydantic import TypeAdapter

from arbiter.client import ArbiterClient
from arbiter.envs_wire import (
    CALLED,
    CREATED,
    DELETED,
    TASKS,
    TOOLS,
    BatchItem,
    ToolRefused,
    batch_body,
    called,
    check,
    create_body,
    idem,
    new_sid,
    opened,
    parse,
    tool_output,
)
from arbiter.errors import (
    ArbiterError,
)
from arbiter.proto.envs import (
    SESSION_HEADER,
    RunToolError,
    RunToolSuccess,
    Split,
    TextBlock,
    ToolOutput,
    ToolSpec,
)
from arbiter.retry import RetryPolicy

__all__ = ["AsyncEnvsClient", "AsyncSession", "EnvsClient", "Session", "ToolRefused"]

ORS_PREFIX = "/ors"
BATCH_PATH = "/v1/envs/batch"  # Arbiter's batch routes (not ORS), at the gateway's root
_RESULT: TypeAdapter[RunToolSuccess | RunToolError] = TypeAdapter(RunToolSuccess | RunToolError)
_NAMES: TypeAdapter[list[str]] = TypeAdapter(list[str])
_SPLITS: TypeAdapter[list[Split]] = TypeAdapter(list[Split])
_BLOCKS: TypeAdapter[list[TextBlock]] = TypeAdapter(list[TextBlock])


class _Base:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        retry: RetryPolicy | None = None,
        prefix: str = ORS_PREFIX,
        **httpx_kwargs: Any,
    ) -> None:
        self.http = ArbiterClient(
            base_url, api_key=api_key, timeout=timeout, retry=retry, **httpx_kwargs
        )
        self.prefix = prefix.rstrip("/")
        if api_key := self.http._headers.get("Authorization", "").removeprefix("Bearer "):
            self.http._headers["X-API-Key"] = api_key  # what ORS servers read

    def _args(self, method: str, path: str) -> tuple[str, str, RetryPolicy]:
        return method, f"{self.prefix}/{path}", self.http.retry


class EnvsClient(_Base):
    """Sync client (the module docstring). Use as a context manager or ``close()``."""

    def _req(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http._request(*self._args(method, path), **kwargs)

    def environments(self) -> list[str]:
        """The environments served (``GET /list_environments``)."""
        return parse(_NAMES, self._req("GET", "list_environments"))

    def tools(self, env: str) -> list[ToolSpec]:
        return parse(TOOLS, self._req("GET", f"{env}/tools")).tools

    def splits(self, env: str) -> list[Split]:
        return parse(_SPLITS, self._req("GET", f"{env}/splits"))

    def tasks(self, env: str, split: str = "test") -> list[dict[str, Any]]:
        r = self._req("POST", f"{env}/tasks", json={"split": split})
        return parse(TASKS, r).tasks

    def session(
        self,
        env: str,
        task_spec: dict[str, Any] | None = None,
        *,
        split: str | None = None,
        index: int | None = None,
    ) -> Session:
        """A new episode of ``env`` on ``task_spec`` (or the task at ``split``/``index``);
        ended (``/delete``) when its ``with`` block ends, or by ``close()``."""
        body = create_body(env, task_spec, split, index)
        sid = new_sid(self._req("POST", "create_session", headers=idem()))
        check(self._req("POST", "create", json=body, headers={SESSION_HEADER: sid, **idem()}))
        return Session(self, env, sid)

    # ---- Arbiter's batch routes: many episodes' calls in one request, each item answered
    # (or its error returned) in its place, as the one-call methods return or raise it

    def _batch(self, op: str, items: list[Any], env: str = "") -> httpx.Response:
        body = batch_body(op, items, env)
        return self.http._request(
            "POST", f"{BATCH_PATH}/{op}", self.http.retry, json=body, headers=idem()
        )

    def open_many(self, env: str, task_specs: list[dict[str, Any]]) -> list[str | ArbiterError]:
        """Episodes of ``env`` on ``task_specs``, opened at once: their sids."""
        r = self._batch("create", task_specs, env)
        return [opened(x) for x in parse(CREATED, r).results]

    def call_many(self, calls: list[BatchItem]) -> list[ToolOutput | ArbiterError]:
        """Tool calls on distinct episodes at once: each one's ``ToolOutput``, or its error
        (``ToolRefused`` when the environment refused it)."""
        return [called(x) for x in parse(CALLED, self._batch("call", calls)).results]

    def delete_many(self, sids: list[str]) -> int:
        """Episodes ended at once: how many were open."""
        return parse(DELETED, self._batch("delete", sids)).deleted

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> EnvsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """One episode (``EnvsClient.session``)."""

    def __init__(self, client: EnvsClient, env: str, sid: str):
        self.client, self.env, self.sid = client, env, sid
        self.closed = False

    def _req(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {SESSION_HEADER: self.sid, **kwargs.pop("headers", {})}
        return check(self.client._req(method, path, headers=headers, **kwargs))

    def prompt(self) -> list[TextBlock]:
        return parse(_BLOCKS, self._req("GET", f"{self.env}/prompt"))

    def call(self, tool: str, **args: Any) -> ToolOutput:
        """Run ``tool`` with ``args``: its ``ToolOutput`` (reward and finished included)."""
        body = {"name": tool, "input": args}
        return tool_output(self._req("POST", f"{self.env}/call", json=body, headers=idem()))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._req("POST", "delete", headers=idem())

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncEnvsClient(_Base):
    """Async client (the module docstring). Use ``async with`` or ``await aclose()``."""

    async def _req(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.http._arequest(*self._args(method, path), **kwargs)

    async def environments(self) -> list[str]:
        return parse(_NAMES, await self._req("GET", "list_environments"))

    async def tools(self, env: str) -> list[ToolSpec]:
        return parse(TOOLS, await self._req("GET", f"{env}/tools")).tools

    async def splits(self, env: str) -> list[Split]:
        return parse(_SPLITS, await self._req("GET", f"{env}/splits"))

    async def tasks(self, env: str, split: str = "test") -> list[dict[str, Any]]:
        r = await self._req("POST", f"{env}/tasks", json={"split": split})
        return parse(TASKS, r).tasks

    def session(
        self,
        env: str,
        task_spec: dict[str, Any] | None = None,
        *,
        split: str | None = None,
        index: int | None = None,
    ) -> AsyncSession:
        """``async with envs.session(...) as episode``: created on entry, ended on exit."""
        return AsyncSession(self, env, create_body(env, task_spec, split, index))

    async def _batch(self, op: str, items: list[Any], env: str = "") -> httpx.Response:
        body = batch_body(op, items, env)
        return await self.http._arequest(
            "POST", f"{BATCH_PATH}/{op}", self.http.retry, json=body, headers=idem()
        )

    async def open_many(
        self, env: str, task_specs: list[dict[str, Any]]
    ) -> list[str | ArbiterError]:
        r = await self._batch("create", task_specs, env)
        return [opened(x) for x in parse(CREATED, r).results]

    async def call_many(self, calls: list[BatchItem]) -> list[ToolOutput | ArbiterError]:
        return [called(x) for x in parse(CALLED, await self._batch("call", calls)).results]

    async def delete_many(self, sids: list[str]) -> int:
        return parse(DELETED, await self._batch("delete", sids)).deleted

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncEnvsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSession:
    """One episode (``AsyncEnvsClient.session``); ``open()`` or ``async with`` creates it."""

    def __init__(self, client: AsyncEnvsClient, env: str, body: dict[str, Any]):
        self.client, self.env, self.body = client, env, body
        self.sid: str | None = None
        self.closed = False

    async def open(self) -> AsyncSession:
        r = await self.client._req("POST", "create_session", headers=idem())
        self.sid = new_sid(r)
        await self._req("POST", "create", json=self.body, headers=idem())
        return self

    async def _req(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        assert self.sid is not None, "open() the session first (or use async with)"
        headers = {SESSION_HEADER: self.sid, **kwargs.pop("headers", {})}
        return check(await self.client._req(method, path, headers=headers, **kwargs))

    async def prompt(self) -> list[TextBlock]:
        return parse(_BLOCKS, await self._req("GET", f"{self.env}/prompt"))

    async def call(self, tool: str, **args: Any) -> ToolOutput:
        body = {"name": tool, "input": args}
        r = await self._req("POST", f"{self.env}/call", json=body, headers=idem())
        return tool_output(r)

    async def close(self) -> None:
        if self.sid is not None and not self.closed:
            self.closed = True
            await self._req("POST", "delete", headers=idem())

    async def __aenter__(self) -> AsyncSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
