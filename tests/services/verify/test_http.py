"""The verify service over HTTP: real uvicorn on free loopback ports.

``verify_url`` is the shared session instance (default settings, 2 workers). A second
instance with a 2 s deadline, math-verify's own timeout set above it (so the wall-clock
kill-and-replace path is what answers), the numeric fast path off (every item goes through
the pool and math-verify) and a small item limit (``strict_url``, conftest.py) serves the
deadline and limit tests.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import ManagedProcess
from tests.services.verify.cases import FORMAT_CASES, MATH_CASES, NULL_CASES
from tests.services.verify.conftest import DEADLINE_S, MARGIN_S, STUCK, metric


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (from /proc), nearest first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _math(url: str, groups: list[dict[str, Any]], timeout: float = 60.0) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/math", json={"groups": groups, "params": {}}, timeout=timeout)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.parametrize("which", ["default", "no_fast_path"])
def test_math_table_over_http(which: str, verify_url: str, strict_url: str) -> None:
    # The same table as the unit test, as one request of one group per case; the
    # no-fast-path instance decides every item with math-verify in the pool.
    url = verify_url if which == "default" else strict_url
    cases = MATH_CASES[:32] if which == "no_fast_path" else MATH_CASES  # its item limit
    groups = [{"id": f"c{i}", "reference": ref, "responses": [resp]}
              for i, (resp, ref, _, _) in enumerate(cases)]  # fmt: skip
    body = _math(url, groups)
    assert body["component"] == "math_accuracy"
    assert body["usage"]["items"] == len(cases)
    for (_, _, expected, why), group in zip(cases, body["groups"], strict=True):
        assert group["scores"] == [expected], f"{why}: {group}"
        assert group["errors"] == [], why


def test_null_cases_over_http(verify_url: str) -> None:
    groups = [{"id": f"n{i}", "reference": ref, "responses": [resp, resp]}
              for i, (resp, ref, _, _) in enumerate(NULL_CASES)]  # fmt: skip
    body = _math(verify_url, groups)
    for (_, _, kind, why), group in zip(NULL_CASES, body["groups"], strict=True):
        assert group["scores"] == [None, None], why
        assert [(e["index"], e["kind"]) for e in group["errors"]] == [(0, kind), (1, kind)], why


def test_format_table_over_http(verify_url: str) -> None:
    client = httpx.Client(timeout=30)
    for response, params, expected, why in FORMAT_CASES:
        r = client.post(
            f"{verify_url}/v1/format",
            json={"groups": [{"id": "f", "responses": [response]}], "params": params},
        )
        assert r.status_code == 200, r.text
        assert r.json()["component"] == "format"
        assert r.json()["groups"][0]["scores"] == [expected], why


def test_groups_echo_ids_and_order(verify_url: str) -> None:
    # Scores come back in request order, per group, with ids echoed, whatever path
    # (fast path, pool, no answer) each item takes.
    groups = [
        {"id": "first", "reference": "#### 5", "responses": ["\\boxed{5}", "4", "$x$", "5"]},
        {"id": "", "reference": "x+1", "responses": ["$1+x$", "\\boxed{x+1}", "\\boxed{x}"]},
        {"id": "third", "reference": "12", "responses": ["nothing", "<answer>12</answer>"]},
    ]
    body = _math(verify_url, groups)
    assert [g["id"] for g in body["groups"]] == ["first", "", "third"]
    assert [g["scores"] for g in body["groups"]] == [
        [1.0, 0.0, 0.0, 1.0],
        [1.0, 1.0, 0.0],  # "$1+x$": no marker, a formula in LaTeX, read whole (not "1")
        [0.0, 1.0],
    ]
    assert body["groups"][2]["info"]["answers"] == [None, "12"]


DEADLINE_CASES = [
    ("\\boxed{7^{123456789}}", "a huge power"),
    ("\\boxed{" + "\\frac{1}{" * 1000 + "2" + "}" * 1000 + "}", "1000 nested fractions"),
    ("1" * 100_000, "a 100,000-digit number (the most characters a response may have)"),
]


@pytest.mark.parametrize(("response", "why"), DEADLINE_CASES, ids=["power", "frac", "digits"])
def test_deadline(response: str, why: str, strict_url: str) -> None:
    # Each pathological item is answered within deadline + margin, as a timeout or a
    # correct score; its neighbours in the same group are scored; the next request is
    # served normally and the pool is back to full strength.
    start = time.monotonic()
    body = _math(strict_url, [{"id": "d", "reference": "5", "responses": [response, "5", "6"]}])
    elapsed = time.monotonic() - start
    assert elapsed < DEADLINE_S + MARGIN_S, f"{why}: {elapsed:.1f}s"
    group = body["groups"][0]
    assert group["scores"][1:] == [1.0, 0.0], why
    if group["scores"][0] is None:
        assert [(e["index"], e["kind"]) for e in group["errors"]] == [(0, "timeout")], why
    else:
        assert group["scores"][0] == 0.0, why

    after = _math(strict_url, [{"id": "n", "reference": "7", "responses": ["\\boxed{7}"]}], 10)
    assert after["groups"][0]["scores"] == [1.0]
    for _ in range(50):  # the replacement worker comes up within moments
        if httpx.get(f"{strict_url}/readyz").status_code == 200:
            break
        time.sleep(0.1)
    assert httpx.get(f"{strict_url}/readyz").json() == {"ready": True, "checks": {"pool": "ok"}}


def test_overrun_kills_and_replaces_worker(strict_url: str) -> None:
    # Two stuck items in one group: both time out (each kills its worker), the others
    # are scored, and the restarts show in /metrics.
    before = metric(strict_url, "verify_worker_restarts_total")
    stuck = STUCK
    start = time.monotonic()
    body = _math(strict_url, [{"reference": "3", "responses": [stuck, "3", stuck, "4", "3"]}])
    assert time.monotonic() - start < 2 * DEADLINE_S + MARGIN_S
    group = body["groups"][0]
    assert group["scores"] == [None, 1.0, None, 0.0, 1.0]
    assert {(e["index"], e["kind"]) for e in group["errors"]} == {(0, "timeout"), (2, "timeout")}
    assert metric(strict_url, "verify_worker_restarts_total") >= before + 2


def test_worker_killed_from_outside_is_replaced(strict_service: tuple[ManagedProcess, str]) -> None:
    # A real fault: SIGKILL one pool worker (a grandchild of uvicorn, below the
    # forkserver) while it is idle. Its slot notices the closed pipe, starts a new worker,
    # and readiness and scoring carry on.
    proc, url = strict_service
    assert proc.proc is not None
    before = metric(url, "verify_worker_restarts_total")
    workers = [p for p in _descendants(proc.proc.pid) if p not in _children(proc.proc.pid)]
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE_S + MARGIN_S
    while metric(url, "verify_worker_restarts_total") < before + 1:
        assert time.monotonic() < deadline, "dead worker not replaced"
        time.sleep(0.1)
    assert httpx.get(f"{url}/readyz").status_code == 200
    body = _math(url, [{"reference": "2", "responses": ["\\boxed{2}"] * 8}])
    assert body["groups"][0]["scores"] == [1.0] * 8


def _children(pid: int) -> list[int]:
    return [p for p in _descendants(pid) if _ppid(p) == pid]


def _ppid(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


ADVERSARIAL = ["<answer>" * 12_000, "\\boxed{" * 14_000, "{" * 99_000, "1," * 49_000]


def test_adversarial_inputs_answered(strict_url: str) -> None:
    # 100k-character inputs built to trip quadratic scans are answered within the bound.
    start = time.monotonic()
    body = _math(strict_url, [{"reference": "1", "responses": ADVERSARIAL}])
    assert time.monotonic() - start < DEADLINE_S + MARGIN_S
    assert len(body["groups"][0]["scores"]) == len(ADVERSARIAL)


BAD_INPUTS = [
    ({"groups": [], "params": {}}, "groups", "no groups"),
    ({"groups": [{"responses": []}], "params": {}}, "groups.0.responses", "empty responses"),
    ({"groups": [{"responses": [1]}], "params": {}}, "groups.0.responses.0", "not a string"),
    ({"groups": [{"responses": "abc"}], "params": {}}, "groups.0.responses", "not a list"),
    ({"groups": [{"responses": ["a"]}], "params": {"tol": 1}}, "params.tol", "unknown param"),
    ({"groups": [{"responses": ["a"], "extra": 1}], "params": {}}, "groups.0.extra", "unknown"),
    ({"groups": [{"responses": ["a"]}]}, "params", "params missing"),
    ({"groups": [{"responses": ["a"]}], "params": {"rel_tolerance": -1}},
     "params.rel_tolerance", "out of range"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "why"), BAD_INPUTS)
def test_bad_input_422(body: dict[str, Any], param: str, why: str, verify_url: str) -> None:
    r = httpx.post(f"{verify_url}/v1/math", json=body)
    assert r.status_code == 422, why
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, (why, err)


def test_bad_format_params_422(verify_url: str) -> None:
    for params, param in [
        ({"mode": "loose"}, "params.mode"),
        ({"think_tag": "a b"}, "params.think_tag"),
    ]:
        r = httpx.post(
            f"{verify_url}/v1/format", json={"groups": [{"responses": ["x"]}], "params": params}
        )
        assert r.status_code == 422 and r.json()["error"]["param"] == param


def test_too_many_items_413(strict_url: str) -> None:
    r = httpx.post(
        f"{strict_url}/v1/math", json={"groups": [{"responses": ["1"] * 65}], "params": {}}
    )
    assert r.status_code == 413
    assert r.json()["error"]["param"] == "groups"


def test_ops_endpoints(verify_url: str) -> None:
    assert httpx.get(f"{verify_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{verify_url}/readyz").json()["checks"] == {"pool": "ok"}
    _math(verify_url, [{"reference": "1", "responses": ["1"]}])
    assert metric(verify_url, "verify_items_total") >= 1
    assert metric(verify_url, "verify_workers_alive") == 2


async def test_concurrent_requests_keep_their_own_results(strict_url: str) -> None:
    # Pool chunks mix items of concurrent requests (fast path off: every item goes to the
    # pool); each request still gets exactly its own scores, in its own order.
    rng = random.Random(7)
    plans = [[rng.random() < 0.5 for _ in range(8)] for _ in range(24)]

    async with httpx.AsyncClient(base_url=strict_url, timeout=60) as client:

        async def one(i: int, plan: list[bool]) -> None:
            responses = [f"\\boxed{{{i if ok else i + 1}}}" for ok in plan]
            body = {"groups": [{"id": f"r{i}", "reference": str(i), "responses": responses}],
                    "params": {}}  # fmt: skip
            r = await client.post("/v1/math", json=body)
            group = r.json()["groups"][0]
            assert group["id"] == f"r{i}"
            assert group["scores"] == [1.0 if ok else 0.0 for ok in plan]

        await asyncio.gather(*(one(i, plan) for i, plan in enumerate(plans)))
