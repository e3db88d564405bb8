"""A client that disconnects while it sends its body is a 499 on the route it was sent to,
logged at info, never a 5xx (a 5xx alert fires on server faults only).

Real processes: the session's gateway (``arbiter serve gateway``) and raw sockets that
send half a request and close.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

HEAD = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s\r\n"
PART = b'{"recipe": "gsm8k", "groups": [{"prompt": "1 + 1?", "reference": "2", "respo'
LENGTH = b"Content-Length: 1000\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
COMPAT = "/v1/compat/openrlhf/{recipe}"

# (the route, what the client sends before it closes, why)
CASES = [
    # a Content-Length of 1000, and 76 bytes of it
    ("/v1/score", HEAD % (b"/v1/score", LENGTH) + PART, "content-length"),
    # a chunked body: one chunk, and no last chunk
    ("/v1/score", HEAD % (b"/v1/score", CHUNKED) + b"%x\r\n%s\r\n" % (len(PART), PART), "chunked"),
    # a compat route: counted under its template, not the path with the recipe in it
    (COMPAT, HEAD % (b"/v1/compat/openrlhf/gsm8k", LENGTH) + b'{"query": ["ab', "compat"),
]


def http_counts(url: str) -> dict[tuple[str, str], float]:
    """(route, status) -> requests the gateway counted in ``arbiter_http_request_seconds``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "arbiter_http_request_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels.get("service") == "gateway":
                out[(sample.labels["route"], sample.labels["status"])] = sample.value
    return out


def server_errors(counts: dict[tuple[str, str], float]) -> float:
    return sum(v for (_, status), v in counts.items() if status.startswith("5"))


def log_of(log_dir: Path, url: str) -> Path:
    return log_dir / f"gateway-{url.rsplit(':', 1)[1]}.log"  # tests.conftest.start_service


@pytest.mark.parametrize(("route", "sent", "why"), CASES, ids=[c[2] for c in CASES])
def test_a_client_that_leaves_mid_body_is_a_499_on_its_route(
    gateway_url: str, log_dir: Path, route: str, sent: bytes, why: str
) -> None:
    before = http_counts(gateway_url)
    log = log_of(log_dir, gateway_url)
    lines_before = log.read_text(errors="replace").count("(499)")
    with socket.create_connection(("127.0.0.1", int(gateway_url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(sent)
        time.sleep(0.2)  # the gateway is reading the body
    deadline = time.monotonic() + 10
    after = http_counts(gateway_url)
    while after.get((route, "499"), 0) == before.get((route, "499"), 0):
        assert time.monotonic() < deadline, f"no 499 counted ({why}): {after}"
        time.sleep(0.1)
        after = http_counts(gateway_url)
    assert after[(route, "499")] == before.get((route, "499"), 0) + 1
    assert server_errors(after) == server_errors(before), after
    assert after.get(("unmatched", "500"), 0) == before.get(("unmatched", "500"), 0)
    text = log.read_text(errors="replace")
    assert text.count("(499)") == lines_before + 1
    line = text[text.rindex("(499)") - 200 :]
    assert f"INFO arbiter: POST {route}: the client disconnected before its answer" in line
    # the gateway still answers
    assert httpx.get(f"{gateway_url}/healthz", timeout=10).status_code == 200
