"""Nothing a deadline decided is cached: a null (``timeout`` above all) is never written, so
the same request again reaches the component and is scored afresh; a score that comes with
an error entry for its index (outside the contract) is served but not cached either.

Every component (verify, judge, embedding, sandbox) behind a real gateway and real Redis. The
component is a real HTTP server that answers as scripted, round by round: whether a
component's own deadline or the host's load decided an answer cannot be caused on demand
(the sandbox's wall-clock backstop fires only on a starved host), and this checks the
gateway's side of the contract for every component alike.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_service

# A round's answer for each response: a score, or a null with an error of the given kind.
Answer = Callable[[int], tuple[float | None, str | None]]


class ScriptedComponent:
    """Answers every component route with a ``ComponentResponse`` built from the request:
    round ``n`` (the n-th request, from 0) gives each response ``script(n)``."""

    def __init__(self, script: Answer) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # a component call
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(body)
                score, kind = outer.script(len(outer.requests) - 1)
                groups = []
                for g in body["groups"]:
                    n = len(g["responses"])
                    errors = [{"index": i, "kind": kind, "message": "scripted"} for i in range(n)]
                    groups.append(
                        {"id": g["id"], "scores": [score] * n, "errors": errors if kind else []}
                    )
                reply = json.dumps({"component": self.path, "groups": groups}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def do_GET(self) -> None:  # readiness probes
                reply = b'{"ready": true, "checks": {}}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Switch:
    """The script every test sets: what the component answers in each round."""

    answer: Answer = staticmethod(lambda n: (1.0, None))

    def __call__(self, n: int) -> tuple[float | None, str | None]:
        return self.answer(n)


@pytest.fixture(scope="module")
def switch() -> Switch:
    return Switch()


@pytest.fixture(scope="module")
def component(switch: Switch) -> Iterator[ScriptedComponent]:
    server = ScriptedComponent(switch)
    yield server
    server.close()


@pytest.fixture(scope="module")
def gateway(log_dir: Path, redis_url: str, component: ScriptedComponent) -> Iterator[str]:
    """Every component's service is the scripted one; the cache is Redis."""
    env = {
        "REDIS_URL": redis_url,
        "GATEWAY_VERIFY_URL": component.url,
        "GATEWAY_JUDGE_URL": component.url,
        "GATEWAY_EMBEDDING_URL": component.url,
        "GATEWAY_SANDBOX_URL": component.url,
    }
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


COMPONENTS = {
    "math_accuracy": {},
    "judge_quality": {},
    "diversity": {},  # group-level: one entry for the whole group
    "code_tests": {},
    "python_grader": {"source": "def grade(sample, item):\n    return 0.75\n"},
}


def score(url: str, name: str, tag: str) -> dict[str, Any]:
    recipe = {"components": [{"name": name, "params": COMPONENTS[name]}]}
    group = {"id": "g", "prompt": f"p {tag}", "reference": "1", "responses": ["a", "b"]}
    r = httpx.post(f"{url}/v1/score", json={"recipe": recipe, "groups": [group]}, timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_a_timeout_null_is_not_cached_and_the_retry_is_scored_anew(
    gateway: str, component: ScriptedComponent, switch: Switch, name: str
) -> None:
    switch.answer = lambda n: (None, "timeout") if n == 0 else (0.75, None)
    component.requests.clear()
    tag = f"{name} {time.monotonic_ns()}"  # a prompt no earlier run cached
    first = score(gateway, name, tag)
    g = first["groups"][0]
    assert g["components"][name] == [None, None], g
    assert {e["kind"] for e in g["errors"]} == {"timeout"}, g
    # the retry: sent to the component again, and its score is the answer
    again = score(gateway, name, tag)
    assert len(component.requests) == 2, component.requests
    assert again["groups"][0]["components"][name] == [0.75, 0.75], again
    assert again["usage"]["cache_hits"] == 0, again["usage"]
    # a real score is cached: the third call is answered without the component
    third = score(gateway, name, tag)
    assert len(component.requests) == 2
    assert third["groups"][0]["components"][name] == [0.75, 0.75]
    assert third["usage"]["cache_hits"] == 2, third["usage"]


def test_a_score_with_an_error_entry_is_served_but_not_cached(
    gateway: str, component: ScriptedComponent, switch: Switch
) -> None:
    # a component that says 0.0 and, for the same response, that a deadline passed: the 0.0
    # is not a verdict to keep for days
    switch.answer = lambda n: (0.0, "timeout") if n == 0 else (1.0, None)
    component.requests.clear()
    tag = f"contract {time.monotonic_ns()}"
    score(gateway, "code_tests", tag)
    again = score(gateway, "code_tests", tag)
    assert len(component.requests) == 2
    assert again["groups"][0]["components"]["code_tests"] == [1.0, 1.0], again
