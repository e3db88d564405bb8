"""A newcomer's wait behind a bulk embedder, with and without the batch token budget.

Issue 31's scenario: team ``bulk`` sends ``--bulk-requests`` (30) concurrent ``diversity``
requests of ``--bulk-texts`` (64) long texts each (``--join`` GSM8K reference solutions
joined: past all-MiniLM-L6-v2's 256-token limit); ``--delay`` seconds later, once bulk's
texts are queued and its batches run, team ``new`` sends one request of 8 short texts.
Measured: the newcomer's answer time, the batches and tokens the service encoded while it
waited (``/metrics``), and bulk's throughput (its texts and tokens over the time from its
first send to its last answer). Each ``--budgets`` value (``EMBEDDING_BATCH_TOKEN_BUDGET``;
0 = none, the baseline) gets its own service process (same model, device, settings
otherwise); with ``--repeats`` > 1 the budgets alternate (A B B A ...) so drifting machine
load hits both alike.

    .venv/bin/python -m bench.services.embedding_starve [--budgets 0,4096] [--repeats 1]
        [--bulk-requests 30] [--bulk-texts 64] [--delay 3] [--device cpu] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from arbiter import gsm8k
from arbiter.procs import free_port, service_process
from arbiter.proto.common import TEAM_HEADER
from bench.record import write_result

log = logging.getLogger("bench.services.embedding_starve")


def texts(join: int, bulk_requests: int, bulk_texts: int) -> tuple[list[list[str]], list[str]]:
    """Bulk's requests (distinct long texts) and the newcomer's 8 short ones."""
    with open(gsm8k.default_dir() / "train.jsonl") as f:
        answers = [json.loads(line)["answer"] for line in f]
    n = bulk_requests * bulk_texts
    long = [" ".join(answers[(i * join + j) % len(answers)] for j in range(join)) for i in
            range(n)]  # fmt: skip
    bulk = [long[r * bulk_texts : (r + 1) * bulk_texts] for r in range(bulk_requests)]
    short = [a.split("\n")[0] for a in answers[-8:]]
    return bulk, short


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus text page."""
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def one_run(
    url: str, bulk: list[list[str]], short: list[str], delay: float
) -> dict[str, Any]:
    def body(responses: list[str]) -> dict[str, Any]:
        return {"groups": [{"id": "g", "responses": responses}], "params": {}}

    async with httpx.AsyncClient(base_url=url, timeout=3600.0) as client:

        async def send(team: str, responses: list[str]) -> tuple[float, dict[str, Any]]:
            r = await client.post("/v1/diversity", json=body(responses),
                                  headers={TEAM_HEADER: team})  # fmt: skip
            r.raise_for_status()
            out: dict[str, Any] = r.json()
            if any(s is None for g in out["groups"] for s in g["scores"]):
                raise RuntimeError(f"null diversity: {str(out)[:300]}")
            return time.perf_counter(), out

        start = time.perf_counter()
        tasks = [asyncio.ensure_future(send("bulk", req)) for req in bulk]
        await asyncio.sleep(delay)
        before = (await client.get("/metrics")).text
        sent = time.perf_counter()
        answered, _ = await send("new", short)
        after = (await client.get("/metrics")).text
        done = await asyncio.gather(*tasks)
    end = max(t for t, _ in done)
    bulk_texts = sum(len(req) for req in bulk)
    bulk_tokens = sum(out["usage"]["prompt_tokens"] for _, out in done)
    return {
        "newcomer_s": answered - sent,
        "batches_while_waiting": metric(after, "arbiter_embedding_batch_texts_count")
        - metric(before, "arbiter_embedding_batch_texts_count"),
        "tokens_while_waiting": metric(after, "arbiter_embedding_tokens_total")
        - metric(before, "arbiter_embedding_tokens_total"),
        "bulk_s": end - start,
        "bulk_texts_per_s": bulk_texts / (end - start),
        "bulk_tokens_per_s": bulk_tokens / (end - start),
    }


def run_budget(budget: int, args: argparse.Namespace, bulk: list[list[str]], short: list[str],
               log_dir: Path) -> dict[str, Any]:  # fmt: skip
    port = free_port()
    env = {"EMBEDDING_DEVICE": args.device, "EMBEDDING_LOG_LEVEL": "warning",
           "EMBEDDING_BATCH_TOKEN_BUDGET": str(budget)}  # fmt: skip
    proc = service_process("embedding", port, env=env, log_path=log_dir / f"starve-{budget}.log",
                           ready_path="/readyz")  # fmt: skip
    proc.start()
    try:
        proc.wait_ready(600.0)
        url = f"http://127.0.0.1:{port}"
        httpx.post(f"{url}/v1/diversity", json={"groups": [{"id": "w", "responses": short}],
                                                "params": {}}, timeout=600.0)  # fmt: skip
        out = asyncio.run(one_run(url, bulk, short, args.delay))
    finally:
        proc.stop()
    log.info("budget %d: %s", budget, {k: round(v, 3) for k, v in out.items()})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", default="0,4096", help="EMBEDDING_BATCH_TOKEN_BUDGET values")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--bulk-requests", type=int, default=30)
    p.add_argument("--bulk-texts", type=int, default=64)
    p.add_argument("--join", type=int, default=3, help="GSM8K answers per long text")
    p.add_argument("--delay", type=float, default=3.0, help="s between bulk's and new's sends")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    budgets = [int(b) for b in args.budgets.split(",")]
    bulk, short = texts(args.join, args.bulk_requests, args.bulk_texts)
    runs: dict[int, list[dict[str, Any]]] = {b: [] for b in budgets}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for b in budgets if i % 2 == 0 else budgets[::-1]:  # A B B A ...
                runs[b].append(run_budget(b, args, bulk, short, Path(tmp)))
    summary = {
        str(b): {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        write_result(args.json, {"args": vars(args) | {"json": str(args.json)},
                                 "median": summary, "runs": {str(b): rs for b, rs in
                                                             runs.items()}})  # fmt: skip


if __name__ == "__main__":
    main()
