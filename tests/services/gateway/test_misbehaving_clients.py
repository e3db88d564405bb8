"""Clients that misbehave below and beside the API: a body sent to a route outside ``/v1``
takes no team's body budget, and an OpenRLHF query that does not validate is refused naming
its field.

Real processes: a gateway with keys (``arbiter serve gateway``), the session's verify
service and Redis; raw sockets where a client misbehaves below HTTP.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.gateway.teams import Keys, groups, post, running_gateway

BODY_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("review") / "keys.yaml")
    k.add("a", "team-a")
    k.add("b", "team-b")
    return k


@pytest.fixture(scope="module")
def upload_gateway(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[str]:
    env = {
        "GATEWAY_MAX_BODY_BYTES": str(BODY_LIMIT),
        "GATEWAY_MAX_BUFFERED_BYTES": str(4 * BODY_LIMIT),  # four stalled uploads fill it
        "GATEWAY_BODY_TIMEOUT_S": "30",
    }
    with running_gateway(log_dir, verify_url, redis_url, keys, **env) as url:
        yield url


def _stall(url: str, path: str, size: int) -> socket.socket:
    """A POST without a key announcing ``size`` bytes that sends all but the last one."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\n"
        f"content-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    )
    sock.sendall(head.encode() + b" " * (size - 1))
    return sock


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


@pytest.mark.parametrize("path", ["/healthz", "/no-such-route"])
def test_bodies_outside_v1_take_no_budget(upload_gateway: str, keys: Keys, path: str) -> None:
    # No key at all: four stalled uploads of (body limit - 1) bytes to a path outside
    # /v1/ (where auth does not apply, and no route takes a body) filled the global body
    # budget, and every team got 429 too_busy until the body deadline (30 s), again and
    # again. Now such a body is never read into a budget: the route's answer comes at once
    # (405 for /healthz; 401 for any other path, which is ORS's at the root and behind a
    # key, refused before its body is read), and the teams are served meanwhile.
    socks = [_stall(upload_gateway, path, BODY_LIMIT) for _ in range(4)]
    try:
        r = post(upload_gateway, {"recipe": "gsm8k", "groups": groups(1, 2)}, keys.headers("b"))
        assert r.status_code == 200, r.text
        answers = [_answer(s) for s in socks]
    finally:
        for s in socks:
            s.close()
    for data in answers:
        assert data.split()[1] == (b"405" if path == "/healthz" else b"401"), data[:300]
        assert b'"error"' in data  # the envelope


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": ["p a"] * 300, "prompts": ["p"] * 300}, "query"),
        ({"query": "p a", "prompts": ["p"]}, "query"),
        ({"query": ["p a", 5], "prompts": ["p", "p"]}, "query.1"),
        ({"query": [], "prompts": []}, "query"),
    ],
)
def test_openrlhf_query_errors_name_the_field(
    upload_gateway: str, keys: Keys, body: dict[str, object], param: str
) -> None:
    # OpenRLHF's field is called ``query``, as FastAPI calls a query-string location: the
    # error's param dropped every ``query`` of its path (param null, "3" for query.3).
    r = post(upload_gateway, body, keys.headers("a"), path="/v1/compat/openrlhf/gsm8k")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}: "), error
