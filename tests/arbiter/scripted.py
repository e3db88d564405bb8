"""A scripted stand-in for the gateway: a real HTTP server on a free loopback port that
plays given answers in order (then a valid ``ScoreResponse``) and records what it received.

It causes what the real gateway will not on demand: a 503 or a 429 with an HTTP-date
``Retry-After`` on the n-th try, a 200 whose body is a proxy's page, requests held open
(to see how many are in flight at once). The client and the trainer tests share it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from arbiter.proto.gateway import GroupScore, RecipeComponent, RecipeRef, ScoreResponse, ScoreUsage

Answer = tuple[int, dict[str, str], bytes]  # status, headers, body


def score_body(group_id: str = "q") -> bytes:
    """A valid ``ScoreResponse`` of one group with one response (reward 1.0)."""
    out = ScoreResponse(
        recipe=RecipeRef(name="gsm8k", fingerprint="sha256:0",
                         components=[RecipeComponent(name="format")]),
        groups=[GroupScore(id=group_id, rewards=[1.0], components={"format": [1.0]},
                           masked=[False])],
        usage=ScoreUsage(),
    )  # fmt: skip
    return out.model_dump_json().encode()


def envelope(kind: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": kind}}).encode()


@dataclass
class Scripted:
    """The server's script and record. ``release`` is set unless a test clears it to hold
    requests open; ``in_flight``/``most_in_flight`` count requests being answered."""

    url: str = ""
    answers: list[Answer] = field(default_factory=list)
    seen: list[tuple[dict[str, str], float]] = field(default_factory=list)  # headers, arrival
    release: threading.Event = field(default_factory=threading.Event)
    in_flight: int = 0
    most_in_flight: int = 0
    delay_s: float = 0.0  # how long each answer takes
    lock: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, n_in_flight: int, timeout: float = 30.0) -> None:
        """Until ``n_in_flight`` requests are held at once (fails the test past timeout)."""
        with self.lock:
            ok = self.lock.wait_for(lambda: self.in_flight >= n_in_flight, timeout)
        assert ok, f"{self.in_flight} requests in flight, waited for {n_in_flight}"


def serve(script: Scripted) -> Iterator[Scripted]:
    script.release.set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.seen.append((dict(self.headers), time.monotonic()))
                script.in_flight += 1
                script.most_in_flight = max(script.most_in_flight, script.in_flight)
                answer = script.answers.pop(0) if script.answers else None
                script.lock.notify_all()
            script.release.wait(60)
            time.sleep(script.delay_s)
            if answer is None:  # the default: a good answer for the request's group
                answer = (200, {}, score_body(body["groups"][0].get("id") or "q"))
            status, headers, data = answer
            with script.lock:
                script.in_flight -= 1
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield script
    finally:
        script.release.set()
        server.shutdown()
        server.server_close()
