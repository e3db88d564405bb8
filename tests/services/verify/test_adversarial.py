"""A hostile math corpus against a real verify service: every item is answered by its
deadline, the normal items beside it are scored right, and size never restarts a worker.

The instance runs as deployed (numeric fast path on, math-verify's own timeout at its
default, 80 % of the deadline: 2 s, whole seconds, so that a cold worker on a loaded
machine still compares 4 with 3 in time) with a 3 s deadline.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_service
from tests.services.verify.conftest import MARGIN_S, metric

WORKERS = 2
DEADLINE_S = 3.0
MAX_CHARS = 100_000  # the most characters a response may have (proto/limits.py)

_MATRIX = "\\begin{pmatrix}" + " \\\\ ".join([" & ".join(["1"] * 150)] * 150) + "\\end{pmatrix}"

# (response, why): each is one request's first response, beside the normal ones below.
CORPUS: list[tuple[str, str]] = [
    ("\\boxed{7^{123456789}}", "a huge power"),
    ("<answer>2^{2^{2^{2^{2^{2}}}}}</answer>", "a tower of powers"),
    ("<answer>9^{9^{9^{9}}}</answer>", "a taller tower"),
    ("<answer>10000!</answer>", "a factorial, read as one (not as 10000)"),
    ("<answer>(10^{9})!</answer>", "a factorial too big to evaluate"),
    ("<answer>100000!!</answer>", "a double factorial"),
    ("\\boxed{" + "\\frac{1}{" * 1000 + "2" + "}" * 1000 + "}", "1000 nested fractions"),
    ("<answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>", "5000 nested brackets"),
    ("\\boxed{" + "\\sqrt{" * 2000 + "9" + "}" * 2000 + "}", "2000 nested roots"),
    ("7" * MAX_CHARS, "a 100,000-digit number (the last-number rule)"),
    ("<answer>" + "3" * (MAX_CHARS - 17) + "</answer>", "a 99,983-digit answer"),
    ("<answer>0." + "3" * (MAX_CHARS - 19) + "</answer>", "a 99,981-digit decimal"),
    ("<answer>" + "0" * (MAX_CHARS - 18) + "3</answer>", "3 behind 99,982 zeros"),
    ("<answer>" + _MATRIX + "</answer>", "a 150 × 150 matrix"),
    ("\\boxed{\\int_0^\\infty e^{-x^2} \\, dx}", "an improper integral"),
    ("\\boxed{\\int x^{x^{x}} \\, dx}", "an integral with no closed form"),
    ("<answer>\\sum_{n=1}^{10^{12}} n^{n}</answer>", "a sum too long to evaluate"),
    ("<answer>\u202e3\u200b\u200d\ufeff\U0001f600\u0301" * 5000 + "</answer>", "unicode junk"),
    ("<answer>\x00\x01\x07\x1b[31m3\x7f\x9f</answer>" * 3000, "control characters"),
    ("<answer>" + "\u0301" * 90_000 + "</answer>", "90,000 combining accents"),
    ("\\boxed{" * 14_000, "14,000 unclosed boxes"),
    ("<answer>" + "x+" * 40_000 + "x</answer>", "a sum of 40,001 terms"),
]

# (response, score) scored beside every corpus item, reference "3": two decided by
# math-verify in the pool (symbolic), two by the numeric fast path.
NORMAL: list[tuple[str, float]] = [
    ("\\boxed{\\sqrt{9}}", 1.0),
    ("<answer>\\frac{12}{4}</answer>", 1.0),
    ("\\boxed{\\sqrt{16}}", 0.0),
    ("The answer is 4.", 0.0),
]


@pytest.fixture(scope="module")
def hard_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_service(
        "verify", log_dir, {"VERIFY_WORKERS": str(WORKERS), "VERIFY_DEADLINE_S": str(DEADLINE_S)}
    )
    yield url
    proc.stop()


async def _score_all(url: str) -> tuple[list[tuple[float, dict[str, Any]]], float]:
    """Every corpus item as its own request, all at once: (latency, group) each, and the
    wall time of the whole lot."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(response: str) -> tuple[float, dict[str, Any]]:
            t0 = time.monotonic()
            responses = [response] + [r for r, _ in NORMAL]
            body = {"groups": [{"reference": "3", "responses": responses}], "params": {}}
            r = await client.post("/v1/math", json=body)
            assert r.status_code == 200, r.text[:300]
            return time.monotonic() - t0, r.json()["groups"][0]

        t0 = time.monotonic()
        out = await asyncio.gather(*(one(resp) for resp, _ in CORPUS))
        return list(out), time.monotonic() - t0


def test_corpus_answered_by_deadline_without_size_restarts(hard_url: str) -> None:
    before = {r: metric(hard_url, "verify_worker_restarts_total", reason=r)
              for r in ("deadline", "crashed", "died_idle")}  # fmt: skip
    results, elapsed = asyncio.run(_score_all(hard_url))
    killed = 0
    for (_, why), (_latency, group) in zip(CORPUS, results, strict=True):
        # the normal items beside the hostile one are scored right
        assert group["scores"][1:] == [s for _, s in NORMAL], (why, group["errors"])
        score = group["scores"][0]
        if score is None:  # a null says why: its deadline (or math-verify's own timeout)
            [error] = group["errors"]
            assert (error["index"], error["kind"]) == (0, "timeout"), (why, error)
            killed += "worker replaced" in error["message"]
        else:
            assert score in (0.0, 1.0) and group["errors"] == [], why
    # Each hostile item costs at most its deadline: the lot shares the workers fairly, so
    # the slowest request waits for at most every worker's share of deadlines.
    bound = math.ceil(len(CORPUS) / WORKERS) * DEADLINE_S + MARGIN_S
    assert elapsed < bound, f"{elapsed:.1f}s for the corpus, bound {bound:.1f}s"
    after = {r: metric(hard_url, "verify_worker_restarts_total", reason=r) for r in before}
    # a worker is replaced only for an item that ran past its deadline - never for size
    assert after["deadline"] - before["deadline"] == killed
    assert after["crashed"] == before["crashed"]
    assert after["died_idle"] == before["died_idle"]
    assert httpx.get(f"{hard_url}/readyz").status_code == 200


def test_corpus_scores(hard_url: str) -> None:
    # What the readable ones are worth (reference 3): a factorial is not its argument,
    # 3 behind zeros is 3, the junk around a 3 is not a clean 3.
    body = {"groups": [{"reference": "3", "responses": [
        "<answer>10000!</answer>", "<answer>" + "0" * 99_000 + "3</answer>", "3" * 99_000,
        "<answer>3!</answer>",
    ]}], "params": {}}  # fmt: skip
    r = httpx.post(f"{hard_url}/v1/math", json=body, timeout=60)
    assert r.json()["groups"][0]["scores"] == [0.0, 1.0, 0.0, 0.0]
    body = {"groups": [{"reference": "6", "responses": ["<answer>3!</answer>"]}], "params": {}}
    r = httpx.post(f"{hard_url}/v1/math", json=body, timeout=60)
    assert r.json()["groups"][0]["scores"] == [1.0]


def test_big_chunks_never_restart_a_worker(hard_url: str) -> None:
    # The respawn storm: 32 responses of ~100,000 characters each, all of it the answer
    # (LaTeX thin spaces after a symbolic value, cheap for math-verify, out of the fast
    # path's reach), go to the pool in chunks of megabytes. The socket's partial writes are
    # the event loop's business: no worker restarts, every item scored right, fast.
    before = metric(hard_url, "verify_worker_restarts_total")
    big = "<answer>x+1" + "\\," * 49_990 + "</answer>"
    start = time.monotonic()
    r = httpx.post(
        f"{hard_url}/v1/math",
        json={"groups": [{"reference": "1+x", "responses": [big] * 32}], "params": {}},
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert r.status_code == 200
    assert r.json()["groups"][0]["scores"] == [1.0] * 32
    assert metric(hard_url, "verify_worker_restarts_total") == before
    assert elapsed < DEADLINE_S + MARGIN_S
