"""``arbiter.envs``: reading ORS answers, and retrying a tool call without running it twice.

The episodes themselves run against the real gateway and envs service in
``tests/services/gateway/test_ors_episodes.py``. Here: the SSE body as the envs service
sends it (a long result in several ``chunk`` events), the ORS refusal and error events,
and a transient 503 — a fault the real stack cannot be made to give on demand, so a small
HTTP server on a real socket answers it once, then a tool result, and records the
``Idempotency-Key`` of each try.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest

from arbiter.envs import EnvsClient, ToolRefused
from arbiter.envs_wire import sse_events, tool_output
from arbiter.errors import BadResponse, Unavailable
from arbiter.retry import RetryPolicy

URL = "http://envs.test/ors/calculator/call"


def sse(result: dict[str, Any], chunk: int = 4096) -> str:
    """An ORS SSE body as the envs service writes it: task_id, chunks, end."""
    text = json.dumps(result)
    parts = [text[i : i + chunk] for i in range(0, len(text), chunk)] or [""]
    events = ["event: task_id\ndata: t-1\n"]
    events += [f"event: chunk\ndata: {p}\n" for p in parts[:-1]]
    events.append(f"event: end\ndata: {parts[-1]}\n")
    return "\n".join(events) + "\n"


def answer(body: str, status: int = 200) -> httpx.Response:
    return httpx.Response(status, text=body, request=httpx.Request("POST", URL))


def test_a_long_result_in_several_chunks_is_one_tool_output() -> None:
    text = "x" * 10_000 + " end"  # three chunk events of at most 4096 characters
    result = {"ok": True, "output": {"blocks": [{"text": text}], "reward": None}}
    body = sse(result)
    assert [e for e, _ in sse_events(body)].count("chunk") == 2
    out = tool_output(answer(body))
    assert out.blocks[0].text == text and out.reward is None and not out.finished


@pytest.mark.parametrize(
    ("body", "error", "code"),
    [
        # the policy's unknown tool: its doing, not retried
        (
            sse({"ok": False, "error": "no tool 'x'", "reason": "not_found"}),
            ToolRefused,
            "not_found",
        ),
        # the server's error event inside the body
        ("event: task_id\ndata: t\n\nevent: error\ndata: boom\n\n", Unavailable, None),
        # a body that never ends
        ("event: task_id\ndata: t\n\n", BadResponse, None),
        # an end event that is not a ToolOutput
        ('event: end\ndata: {"ok": true}\n\n', BadResponse, None),
    ],
    ids=["refused", "error-event", "no-end", "not-a-tool-output"],
)
def test_what_is_not_a_tool_output_raises(
    body: str, error: type[Exception], code: str | None
) -> None:
    with pytest.raises(error) as raised:
        tool_output(answer(body))
    if code is not None:
        assert getattr(raised.value, "code", None) == code


class _Flaky(BaseHTTPRequestHandler):
    """503 on the first tool call, the result on the next; every try's key recorded."""

    calls: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/call"):
            _Flaky.calls.append(self.headers.get("Idempotency-Key"))
            if len(_Flaky.calls) == 1:
                self._send(503, "application/json", json.dumps({"error": {
                    "message": "sandbox unavailable", "type": "service_unavailable",
                    "code": "unavailable"}}))  # fmt: skip
                return
            result = {"ok": True, "output": {"blocks": [{"text": "9"}], "reward": None}}
            self._send(200, "text/event-stream", sse(result))
        elif self.path.endswith("/create_session"):
            self._send(
                200, "text/event-stream", "event: task_id\ndata: s-1\n\nevent: end\ndata: \n\n"
            )
        else:
            self._send(200, "application/json", json.dumps({"sid": "s-1"}))

    def _send(self, status: int, ctype: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    _Flaky.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_retried_tool_call_sends_the_same_idempotency_key(flaky: str) -> None:
    retry = RetryPolicy(attempts=3, base_delay=0.01)
    envs = EnvsClient(flaky, api_key="k", retry=retry)
    with envs, envs.session("calculator", {"question": "?", "answer": "9"}) as episode:
        out = episode.call("calculate", expression="16 - 3 - 4")
    assert out.blocks[0].text == "9"
    first, second = _Flaky.calls
    assert first is not None and first == second  # one call, tried twice, one key
    with EnvsClient(flaky) as envs, pytest.raises(ValueError):
        envs.session("calculator")  # neither a task_spec nor split and index
