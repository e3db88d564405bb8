"""Sandbox throughput: programs per second through ``POST /v1/code_tests`` against the same
programs in a plain subprocess, same run, same cores.

Three workloads, each response one program with its group's tests:

- ``trivial``: ``def f(): return 1`` against one assert (the sandbox's own cost dominates);
- ``test_heavy``: a prime test against 60 asserts, a few ms of Python each;
- ``stdio``: a program that reads a line and prints it doubled, against 10 stdin/stdout
  pairs (one process per pair, in the sandbox and in the baseline alike).

The baseline runs the same code with the same interpreter (``python3 -I -S``) in a plain
``subprocess`` per program (per pair for stdio), as many at once as the service has
workers: no namespaces, no limits, no HTTP. The service runs with
``SANDBOX_WORKERS`` = the baseline's parallelism; requests carry ``--group`` responses
in one group, ``--clients`` requests in flight. Each row reports programs/s, the ratio to
the baseline, and the CPU time per program of the service's process tree (the service,
its sandboxes) and of the baseline's children.

    .venv/bin/python -m bench.services.sandbox [--programs 400] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import aiohttp

from arbiter.procs import free_port, service_process
from arbiter.services.sandbox.settings import SandboxSettings
from bench import record
from bench.services.procstat import cpu_seconds, tree, tree_cpu_seconds

PRIME = (
    "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n"
    "    while i * i <= n:\n        if n % i == 0:\n            return False\n"
    "        i += 1\n    return True\n"
)


def _prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))


def workloads() -> dict[str, dict[str, Any]]:
    heavy_tests = "".join(
        f"assert is_prime({n}) is {_prime(n)}\n" for n in range(7919 - 59 * 7, 7920, 7)
    )
    pairs = [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in range(10)]
    return {
        "trivial": {"program": "def f():\n    return 1\n", "tests": "assert f() == 1\n"},
        "test_heavy": {"program": PRIME, "tests": heavy_tests},
        "stdio": {"program": "print(2 * int(input()))\n", "pairs": pairs},
    }


# ------------------------------------------------------------------ the plain baseline


async def _plain_one(python: str, load: dict[str, Any]) -> None:
    if "pairs" in load:
        for pair in load["pairs"]:
            proc = await asyncio.create_subprocess_exec(
                python, "-I", "-S", "-c", load["program"],
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate(pair["input"].encode())
            assert out.decode().strip() == pair["output"].strip()
        return
    proc = await asyncio.create_subprocess_exec(
        python, "-I", "-S", "-c", load["program"] + load["tests"]
    )
    assert await proc.wait() == 0


async def plain(python: str, load: dict[str, Any], n: int, parallel: int) -> dict[str, float]:
    """``n`` programs, ``parallel`` at a time, each in its own plain subprocess."""
    sem = asyncio.Semaphore(parallel)

    async def one() -> None:
        async with sem:
            await _plain_one(python, load)

    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"programs_per_s": n / wall, "wall_s": wall, "cpu_ms_per_program": cpu / n * 1e3}


# ------------------------------------------------------------------ the service


def _group(load: dict[str, Any], size: int, tag: str) -> dict[str, Any]:
    reference = json.dumps(load["pairs"]) if "pairs" in load else load["tests"]
    # distinct texts (a comment): nothing is deduplicated or cached
    responses = [f"{load['program']}# {tag} {k}\n" for k in range(size)]
    return {"id": tag, "prompt": "", "reference": reference, "responses": responses}


async def service(
    url: str, pids: list[int], load: dict[str, Any], n: int, group: int, clients: int
) -> dict[str, float]:
    requests = [{"groups": [_group(load, group, f"r{i}")], "params": {}} for i in range(n // group)]
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in requests:
        queue.put_nowait(body)
    scores: list[float] = []

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            body = queue.get_nowait()
            async with session.post(f"{url}/v1/code_tests", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
            scores.extend(s for g in answer["groups"] for s in g["scores"])

    # the tree: the service and its live sandboxes (a sandbox's reaped jobs in its cutime)
    before = {pid: tree_cpu_seconds([pid]) for pid in tree(pids[0])}
    own0 = cpu_seconds(pids[0])
    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = time.perf_counter() - start
    cpu = sum(tree_cpu_seconds([pid]) - before.get(pid, 0.0) for pid in tree(pids[0]))
    own = cpu_seconds(pids[0]) - own0  # the service's own process: HTTP, spawning sandboxes
    done = len(requests) * group
    assert scores == [1.0] * done, sorted(set(map(str, scores)))
    return {
        "programs_per_s": done / wall,
        "wall_s": wall,
        "cpu_ms_per_program": cpu / done * 1e3,
        "service_cpu_ms_per_program": own / done * 1e3,
    }


async def run(
    programs: int, workers: int, group: int, clients: int, nice: int = 0, spare: int | None = None
) -> dict[str, Any]:
    loadavg = os.getloadavg()
    python = SandboxSettings().python  # the interpreter the service will run programs with
    port = free_port()
    # the programs at the baseline's priority (the service's default, 19, yields to anything
    # else on the host: on a shared machine that measures the neighbours, not the sandbox)
    env = {
        "SANDBOX_WORKERS": str(workers),
        "SANDBOX_NICE": str(nice),
        **({"SANDBOX_SPARE": str(spare)} if spare is not None else {}),
        "SANDBOX_LOG_LEVEL": "warning",
    }
    proc = service_process("sandbox", port, env=env)
    proc.start()
    proc.wait_ready(60)
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.proc is not None
        pids = [proc.proc.pid]
        rows: dict[str, Any] = {}
        for name, load in workloads().items():
            n = programs // 4 if name == "stdio" else programs
            await service(url, pids, load, 2 * group, group, clients)  # warm-up
            base = await plain(python, load, n, workers)
            got = await service(url, pids, load, n, group, clients)
            rows[name] = {
                "programs": n,
                "sandbox": got,
                "plain_subprocess": base,
                "ratio": got["programs_per_s"] / base["programs_per_s"],
                "overhead_ms_per_program": (1 / got["programs_per_s"] - 1 / base["programs_per_s"])
                * 1e3
                * workers,
            }
            print(
                f"{name:10s} sandbox {got['programs_per_s']:7.1f}/s "
                f"({got['cpu_ms_per_program']:5.1f} ms CPU each, service "
                f"{got['service_cpu_ms_per_program']:4.1f})   plain "
                f"{base['programs_per_s']:7.1f}/s ({base['cpu_ms_per_program']:5.1f} ms)   "
                f"ratio {rows[name]['ratio']:.2f}",
                flush=True,
            )
    finally:
        proc.stop()
    return {
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}",
        "python": python,
        "workers": workers,
        "nice": nice,
        "spare": spare,
        "load_average_before": loadavg,
        "group": group,
        "clients": clients,
        "workloads": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=400, help="programs per workload")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--group", type=int, default=8, help="responses per request")
    parser.add_argument("--clients", type=int, default=4, help="requests in flight")
    parser.add_argument("--nice", type=int, default=0, help="SANDBOX_NICE of the service")
    parser.add_argument("--spare", type=int, help="SANDBOX_SPARE (default: the service's)")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--plot", action="store_true", help="redraw the docs figure from --json")
    args = parser.parse_args()
    if args.plot and not args.json:
        parser.error("--plot draws from the --json file: give --json too")
    out = asyncio.run(
        run(args.programs, args.workers, args.group, args.clients, args.nice, args.spare)
    )
    if args.json:
        record.write_result(args.json, out, indent=2)
    if args.plot:
        from bench.services import plots

        print(plots.render("sandbox", args.json))


if __name__ == "__main__":
    main()
