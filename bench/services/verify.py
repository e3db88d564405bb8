"""Verify throughput: the HTTP service against the same rule in-process, same run, same cores.

GSM8K-like responses (8 per group) scored by ``POST /v1/math`` and, as baselines, in a
``multiprocessing.Pool(2)`` over the same responses with all work queued up front:

- the same rule in-process (``score_math_direct``: our extraction, the numeric fast path,
  math-verify for the rest): the same work as the service with its default settings;
- the same rule with the fast path off (math-verify on every item): the same work as the
  service with ``VERIFY_FAST_PATH=false``;
- plain math-verify (``verify(parse(gold), parse(response))``), different work, for scale.

The service runs with both settings and two request shapes: one group of 8 per request
(16 clients), and one GRPO batch per request (64 groups, 512 responses; 2 clients), which
is what the gateway sends for a ``/v1/score`` of a whole batch. The load generator is an
aiohttp client in this process; its own CPU time is reported beside each HTTP row (on a
2-core machine it competes with the service for the same cores), and so is the CPU time
of the service's processes.

    .venv/bin/python -m bench.services.verify [--groups 1319] [--rounds 3] [--serve-processes 1]
        [--json out.json]

``run(...)`` returns the numbers as a dict for a combined benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import multiprocessing as mp
import os
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from arbiter import gsm8k
from arbiter.procs import ManagedProcess, free_port, service_process
from bench import record
from bench.services.procstat import tree, tree_cpu_seconds

log = logging.getLogger("bench.services.verify")

GSM8K = gsm8k.default_dir()
GROUP = 8
BATCH_GROUPS = 64  # groups per request in the "batch" shape (one GRPO batch)

_CALC = re.compile(r"<<[^>]*>>")


def _responses(rationale: str, value: str, rng: random.Random) -> list[str]:
    """Eight responses in varied formats, about two thirds right."""
    steps = _CALC.sub("", rationale.rsplit("####", 1)[0]).strip()
    wrong = str(int(value.replace(",", "")) + rng.choice([-2, -1, 1, 10]))
    formats = [
        lambda v: f"<think>\n{steps}\n</think>\n<answer>{v}</answer>",
        lambda v: f"{steps}\nSo the answer is $\\boxed{{{v}}}$.",
        lambda v: f"{steps}\n#### {v}",
        lambda v: f"{steps}\nThe answer is {v}.",
        lambda v: f"<think>{steps}</think><answer>{v} dollars</answer>",
        lambda v: f"{steps}\nTotal: **{v}**",
        lambda v: (
            f"<think>{steps}</think>\n<answer>\\frac{{{2 * int(v.replace(',', ''))}}}{{2}}</answer>"
        ),
        lambda v: f"{steps}\nA: {v}.00",
    ]
    return [fmt(value if rng.random() < 0.67 else wrong) for fmt in formats]


def load_groups(n_groups: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = [json.loads(line) for line in (GSM8K / "test.jsonl").open()]
    groups = []
    for i in range(n_groups):
        row = rows[i % len(rows)]
        value = row["answer"].rsplit("####", 1)[1].strip()
        groups.append(
            {
                "id": f"q{i}",
                "reference": row["answer"],
                "responses": _responses(row["answer"], value, rng),
            }
        )
    return groups


# ------------------------------------------------------------------ in-process baselines


def _mv_one(task: tuple[str, str]) -> bool:
    from math_verify import parse, verify

    response, gold = task
    return bool(verify(parse(gold), parse(response)))


def _rule_fast(task: tuple[str, str]) -> bool:
    """The service's rule with its defaults: extraction, fast path, math-verify for the rest."""
    from arbiter.services.verify.scoring import score_math_direct

    response, reference = task
    return score_math_direct(response, reference).score == 1.0


def _rule_mv(task: tuple[str, str]) -> bool:
    """The service's rule with the fast path off: extraction, then math-verify on every item."""
    from arbiter.services.verify.extract import extract_answer, reference_value
    from arbiter.services.verify.worker import score_item

    response, reference = task
    gold, ex = reference_value(reference), extract_answer(response)
    if gold is None or ex.status != "ok":
        return False
    return score_item(gold, ex.text, 1e-6, 5, True).score == 1.0


def _pool_init() -> None:
    """As the service's workers start: the rule's modules imported, their heap frozen (out of
    the garbage collector's full walks), so the baseline has the service's advantages."""
    import arbiter.services.verify.scoring  # noqa: F401

    gc.freeze()


def _pool_run(
    fn: Callable[[tuple[str, str]], bool], tasks: list[tuple[str, str]], processes: int
) -> dict[str, float]:
    with mp.get_context("forkserver").Pool(processes, initializer=_pool_init) as pool:
        pool.map(fn, tasks[:200], chunksize=16)  # warm-up: imports, caches
        pids = [p.pid for p in pool._pool]  # type: ignore[attr-defined]
        cpu0, start = tree_cpu_seconds(pids) + time.process_time(), time.perf_counter()
        results = pool.map(fn, tasks, chunksize=64)
        elapsed = time.perf_counter() - start
        cpu = tree_cpu_seconds(pids) + time.process_time() - cpu0
    return {"responses": len(tasks), "seconds": elapsed, "rps": len(tasks) / elapsed,
            "correct": sum(results), "cpu_s": cpu,
            "cpu_us_per_response": cpu / len(tasks) * 1e6}  # fmt: skip


def baselines(
    groups: list[dict[str, Any]],
    processes: int = 2,
    fast_groups: list[dict[str, Any]] | None = None,
) -> dict[str, dict[str, float]]:
    """The in-process rows; the fast-path rule runs over ``fast_groups`` (default ``groups``)."""

    def by_ref(gs: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(r, g["reference"]) for g in gs for r in g["responses"]]

    by_gold = [(r, g["reference"].rsplit("####", 1)[1].strip()) for g in groups
               for r in g["responses"]]  # fmt: skip
    return {
        "plain_math_verify": _pool_run(_mv_one, by_gold, processes),
        "rule_fast_path": _pool_run(_rule_fast, by_ref(fast_groups or groups), processes),
        "rule_no_fast_path": _pool_run(_rule_mv, by_ref(groups), processes),
    }


# ------------------------------------------------------------------ service


async def _drive(
    url: str, groups: list[dict[str, Any]], per_request: int, concurrency: int
) -> dict[str, float]:
    bodies = [
        json.dumps({"groups": groups[i : i + per_request], "params": {}}).encode()
        for i in range(0, len(groups), per_request)
    ]
    queue = list(reversed(bodies))
    latencies: list[float] = []
    correct = nulls = 0
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal correct, nulls
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                async with session.post(f"{url}/v1/math", data=body, headers=headers) as r:
                    raw = await r.read()
                latencies.append(time.perf_counter() - t0)
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {raw[:200]!r}")
                for group in json.loads(raw)["groups"]:
                    correct += sum(1 for s in group["scores"] if s == 1.0)
                    nulls += sum(1 for s in group["scores"] if s is None)

        cpu0, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed, client_cpu = time.perf_counter() - start, time.process_time() - cpu0
    latencies.sort()
    n = sum(len(g["responses"]) for g in groups)
    return {"responses": n, "seconds": elapsed, "rps": n / elapsed, "correct": correct,
            "nulls": nulls, "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "client_cpu_s": client_cpu, "client_cpu_share": client_cpu / elapsed}  # fmt: skip


def _measure(
    proc: ManagedProcess, url: str, groups: list[dict[str, Any]], per_request: int,
    concurrency: int,
) -> dict[str, float]:  # fmt: skip
    assert proc.proc is not None
    pids = tree(proc.proc.pid)
    cpu0 = tree_cpu_seconds(pids)
    out = asyncio.run(_drive(url, groups, per_request, concurrency))
    out["service_cpu_s"] = tree_cpu_seconds(pids) - cpu0
    out["cpu_us_per_response"] = out["service_cpu_s"] / out["responses"] * 1e6
    out["per_request"] = per_request * GROUP
    out["concurrency"] = concurrency
    return out


@contextlib.contextmanager
def service(
    workers: int, fast_path: bool, processes: int = 1
) -> Iterator[tuple[ManagedProcess, str]]:
    """A verify service on a free port (as in production: ``arbiter serve``) with
    ``VERIFY_PROCESSES=processes`` event-loop processes (each its own SO_REUSEPORT socket),
    each with a pool of ``workers``."""
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"bench-verify-{port}.log"
    env = {
        "VERIFY_PROCESSES": str(processes),
        "VERIFY_WORKERS": str(workers),
        "VERIFY_FAST_PATH": str(fast_path).lower(),
    }
    proc = service_process("verify", port, env=env, log_path=log_path)
    proc.start()
    try:
        proc.wait_ready(60)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _best(old: dict[str, float] | None, new: dict[str, float]) -> dict[str, float]:
    return new if old is None or new["rps"] > old["rps"] else old


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


SHAPES = {"group": (1, 16), "batch": (BATCH_GROUPS, 2)}  # groups per request, clients
# The fast-path rows (service and baseline alike) go over the groups this many times: one
# pass takes ~0.25 s, short enough for one scheduler hiccup on a shared machine to decide it.
FAST_REPEAT = 4


def run(
    groups: int = 1319,
    workers: int = 2,
    processes: int = 2,
    rounds: int = 3,
    serve_processes: int = 1,
) -> dict[str, Any]:
    """Best of ``rounds`` for each row; the rows alternate within a round so that a change
    in the machine's load (it is shared) hits all of them alike."""
    data = load_groups(groups)
    fast_data = data * FAST_REPEAT
    out: dict[str, Any] = {
        "machine": f"{os.cpu_count()}-core CPU",
        "groups": groups,
        "group_size": GROUP,
        "fast_path_repeat": FAST_REPEAT,
        "rounds": rounds,
        "serve_processes": serve_processes,
        "load_before": _load(),
        "load_per_round": [],
    }
    best: dict[str, dict[str, float] | None] = {}
    with (
        service(workers, True, serve_processes) as fast,
        service(workers, False, serve_processes) as slow,
    ):
        for _, url in (fast, slow):  # warm-up
            asyncio.run(_drive(url, data[:128], 1, 16))
        # Each round's same-work ratio against that round's baseline: with few client
        # connections the ratio depends on how they land on the service's processes.
        per_round: dict[str, list[float]] = {}
        for _ in range(rounds):
            out["load_per_round"].append(_load())
            base = baselines(data, processes, fast_data)
            for key, value in base.items():
                best[key] = _best(best.get(key), value)
            for mode, (proc, url), items in (
                ("fast_path", fast, fast_data),
                ("no_fast_path", slow, data),
            ):
                for shape, (per_request, clients) in SHAPES.items():
                    key = f"http_{mode}_{shape}"
                    row = _measure(proc, url, items, per_request, clients)
                    best[key] = _best(best.get(key), row)
                    per_round.setdefault(f"ratio_{mode}_{shape}", []).append(
                        round(row["rps"] / base[f"rule_{mode}"]["rps"], 2)
                    )
        out["ratio_per_round"] = per_round
    out.update(best)
    out["load_after"] = _load()
    for mode in ("fast_path", "no_fast_path"):
        base = out[f"rule_{mode}"]["rps"]
        for shape in SHAPES:
            out[f"ratio_{mode}_{shape}"] = out[f"http_{mode}_{shape}"]["rps"] / base
    return out


def table(r: dict[str, Any]) -> str:
    lines = [
        f"verify, {r['groups']} groups × {r['group_size']} GSM8K-like responses; "
        f"(fast-path rows: {r['fast_path_repeat']} passes); {r['machine']}; "
        f"best of {r['rounds']} rounds; uvicorn processes: {r['serve_processes']}",
        "| what | responses/s | same-work ratio | p50 / p99 per request | client CPU | "
        "service CPU | CPU µs per response | correct |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, what in (
        ("rule_fast_path", "same rule in-process, fast path on (default), Pool(2)"),
        ("rule_no_fast_path", "same rule in-process, fast path off (all math-verify), Pool(2)"),
        ("plain_math_verify", "plain math-verify in-process, Pool(2) (different work)"),
    ):
        b = r[key]
        ratio = "1.00" if key.startswith("rule") else "–"
        lines.append(f"| {what} | {b['rps']:,.0f} | {ratio} | – | – | – "
                     f"| {b['cpu_us_per_response']:.1f} | {b['correct']} |")  # fmt: skip
    for mode, label in (("fast_path", "fast path on"), ("no_fast_path", "fast path off")):
        for shape, (per_request, clients) in SHAPES.items():
            h = r[f"http_{mode}_{shape}"]
            lines.append(
                f"| HTTP /v1/math, {label}, {per_request * GROUP} responses/request, "
                f"{clients} clients | {h['rps']:,.0f} | {r[f'ratio_{mode}_{shape}']:.2f} "
                f"| {h['p50_ms']:.1f} / {h['p99_ms']:.1f} ms "
                f"| {h['client_cpu_s']:.2f} s ({h['client_cpu_share']:.0%} of a core) "
                f"| {h['service_cpu_s']:.2f} s | {h['cpu_us_per_response']:.1f} "
                f"(+{h['client_cpu_s'] / h['responses'] * 1e6:.1f} client) | {h['correct']} |"
            )
    lines.append("same-work ratio round by round: " + "; ".join(
        f"{k[6:]} {' / '.join(f'{v:.2f}' for v in vs)}" for k, vs in r["ratio_per_round"].items()
    ))  # fmt: skip
    lines += [f"load before: {r['load_before']}", f"load after:  {r['load_after']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1319)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--serve-processes",
        type=int,
        default=1,
        help="VERIFY_PROCESSES: event-loop processes, each with a pool of --workers",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--plot", action="store_true", help="redraw the docs figure from --json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = run(
        args.groups, args.workers, rounds=args.rounds, serve_processes=args.serve_processes
    )
    print(table(result))
    if args.json:
        record.write_result(args.json, result, indent=2)
        if args.plot:
            from bench.services import plots

            print(plots.render("verify", args.json))


if __name__ == "__main__":
    main()
