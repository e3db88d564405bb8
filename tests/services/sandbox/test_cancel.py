"""A request whose client leaves has its running sandboxes killed and its queued responses
dropped: the next caller does not wait for work nobody will read."""

from __future__ import annotations

import contextlib
import re
import time

import httpx

from tests.services.sandbox.conftest import Sandbox, group

# Ten stdin/stdout pairs whose program sleeps past each pair's 2 s: one response holds a
# worker for its whole 6 s deadline, unless it is killed.
SLEEPER = "import time\ntime.sleep(100)\n"
PAIRS = "[" + ", ".join('{"input": "", "output": "x"}' for _ in range(10)) + "]"


def cancelled(sandbox: Sandbox) -> float:
    text = httpx.get(f"{sandbox.url}/metrics", timeout=5).text
    found = re.search(r'^arbiter_http_cancelled_total\{service="sandbox"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_caller_that_leaves_frees_the_workers(sandbox: Sandbox) -> None:
    before = cancelled(sandbox)
    # four responses for two workers: two run, two wait; the client gives up after 1 s
    body = {"groups": [group(PAIRS, *[f"{SLEEPER}# {k}\n" for k in range(4)])], "params": {}}

    with contextlib.suppress(httpx.TimeoutException):  # the point: it hangs up
        httpx.post(f"{sandbox.url}/v1/code_tests", json=body, timeout=1.0)
    deadline = time.monotonic() + 10
    while cancelled(sandbox) <= before:  # the service noticed and cancelled the request
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.05)
    start = time.monotonic()
    body = {"groups": [group("assert f() == 1\n", "def f():\n    return 1\n")], "params": {}}
    r = httpx.post(f"{sandbox.url}/v1/code_tests", json=body, timeout=30)
    waited = time.monotonic() - start
    assert r.status_code == 200 and r.json()["groups"][0]["scores"] == [1.0], r.text
    # the leaver's sandboxes were killed: no 6 s wait for a worker (nor 12 s for its queue)
    assert waited < 3.0, waited
