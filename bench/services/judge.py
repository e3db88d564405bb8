"""Judge throughput: the judge service against direct calls to the same vLLM server.

Both sides send the very same chat-completion bodies (built by the judge's own payload
code) to one vLLM OpenAI server with the same number of requests in flight: *direct*
keeps ``concurrency`` requests open from one ``httpx.AsyncClient``; *service* starts the
judge with ``JUDGE_MAX_CONCURRENCY=concurrency`` and keeps enough groups of 8 in flight
to fill it. Rounds alternate direct/service (ABBA) so that load from other processes hits
both; the ratio is service / direct items/s over all rounds (also: the median of the
per-pair ratios, and CPU ms per item of the direct client and of the judge process).
Target ≥ 0.95.

    .venv/bin/python -m bench.services.judge [--items 128] [--concurrency 32] [--rounds 8]
        [--base-url URL --model NAME]   # else: build the tiny model, start vLLM

vLLM comes from ``ARBITER_VLLM_PYTHON`` (or ``.venv-vllm/bin/python``) when the bench
starts it. ``run(...)`` returns the numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from arbiter import gsm8k
from arbiter.procs import ManagedProcess, free_port, service_process
from arbiter.proto.components import ScoreGroup
from arbiter.proto.judge import QualityParams, VerifierParams, VerifierRequest
from arbiter.services.judge.parsing import (
    JudgeReplyError,
    first_token_top_logprobs,
    label_probability,
    message_text,
    parse_quality,
)
from arbiter.services.judge.scoring import Judge
from arbiter.services.judge.settings import JudgeSettings
from arbiter.tiny_model import build
from bench import record
from bench.services.procstat import cpu_seconds

log = logging.getLogger("bench.services.judge")

REPO = Path(__file__).resolve().parents[2]
GSM8K = gsm8k.default_dir()
GROUP = 8
VLLM_FLAGS = [
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
    "--max-logprobs", "-1", "--block-size", "32", "--enable-prompt-tokens-details",
    "--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}',
]  # fmt: skip


def groups(n_items: int) -> list[ScoreGroup]:
    """GSM8K test questions, 8 short responses each (right and wrong final answers)."""
    out = []
    lines = (GSM8K / "test.jsonl").read_text().splitlines()
    for k in range((n_items + GROUP - 1) // GROUP):
        row = json.loads(lines[k])
        value = row["answer"].split("####")[-1].strip()
        responses = [
            f"<think>step {j}: compute it</think><answer>{value if j % 3 else int(j) + 1}</answer>"
            for j in range(GROUP)
        ]
        out.append(
            ScoreGroup(
                id=f"g{k}", prompt=row["question"], reference=f"#### {value}", responses=responses
            )
        )
    return out


def payloads(component: str, gs: list[ScoreGroup], judge: Judge) -> list[dict[str, Any]]:
    if component == "quality":
        params = QualityParams()
        return [judge.quality_payload(g, r, params, True) for g in gs for r in g.responses]
    req = VerifierRequest(groups=gs, params=VerifierParams())
    return [judge.verifier_payload(g, r, req) for g in gs for r in g.responses]


async def direct(
    base_url: str,
    model: str,
    component: str,
    bodies: list[dict[str, Any]],
    conc: int,
    pool_size: int | None = None,
) -> float:
    """Seconds for ``bodies`` with ``conc`` requests in flight straight to the server, each
    reply read into a score as a caller would (same parsing functions as the service).

    ``pool_size=None``: one ``httpx.AsyncClient`` (the obvious client). ``pool_size=8``:
    connections split over clients of 8, as the judge did while it used httpx.
    """
    size = pool_size or conc
    n_pools = -(-conc // size)
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    free: asyncio.Queue[int] = asyncio.Queue()
    for i in range(conc):
        free.put_nowait(i)
    pools = [
        httpx.AsyncClient(base_url=base_url + "/", limits=limits, timeout=300)
        for _ in range(n_pools)
    ]

    async def one(body: dict[str, Any]) -> None:
        slot = await free.get()
        try:
            http = pools[slot % n_pools]
            r = await http.post("chat/completions", json={"model": model, **body})
            r.raise_for_status()
        finally:
            free.put_nowait(slot)
        try:
            if component == "quality":
                parse_quality(message_text(r.json()), 5)
            else:
                label_probability(first_token_top_logprobs(r.json()))
        except JudgeReplyError:
            pass

    try:
        start = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - start
    finally:
        for http in pools:
            await http.aclose()


async def service(
    judge_url: str, component: str, gs: list[ScoreGroup], conc: int
) -> tuple[float, Counter[str]]:
    """Seconds through the judge service; groups in flight enough to fill its semaphore."""
    in_flight = max(2, 2 * conc // GROUP)
    sem = asyncio.Semaphore(in_flight)
    kinds: Counter[str] = Counter()
    params: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=300) as http:

        async def one(g: ScoreGroup) -> None:
            async with sem:
                body = {"groups": [g.model_dump()], "params": params}
                r = await http.post(f"{judge_url}/v1/{component}", json=body)
                r.raise_for_status()
                for e in r.json()["groups"][0]["errors"]:
                    kinds[e["kind"]] += 1

        start = time.perf_counter()
        await asyncio.gather(*(one(g) for g in gs))
        return time.perf_counter() - start, kinds


class _SameSession(ManagedProcess):
    """Started in the bench's own session (its own process group, for stopping).

    Linux groups CPU time by session (``sched_autogroup``): a server started with
    ``start_new_session`` competes as a group of its own against every other session on a
    shared machine. Here vLLM, the judge and the bench's client all share one group, so
    direct calls and calls through the judge get the same CPU budget.
    """

    def start(self) -> ManagedProcess:
        env = {**os.environ, **self.env}
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0
        )
        return self


def _vllm_python() -> str:
    path = os.environ.get("ARBITER_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"no vLLM python at {path}: set ARBITER_VLLM_PYTHON (make vllm)")
    return path


def start_vllm(model_dir: Path, log_path: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [
        _vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), *VLLM_FLAGS,
    ]  # fmt: skip
    proc = _SameSession(
        "vllm",
        argv,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"},
        ready_url=f"http://127.0.0.1:{port}/health",
        log_path=log_path,
    ).start()
    proc.wait_ready(300)
    return proc, f"http://127.0.0.1:{port}/v1"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


async def _measure(
    base_url: str, model: str, judge_url: str, judge_pid: int, items: int, conc: int, rounds: int
) -> dict[str, Any]:
    gs = groups(items)
    judge = Judge(JudgeSettings(base_url=base_url, model=model, constrain_labels=True))
    results: dict[str, Any] = {}
    for component in ("verifier", "quality"):
        bodies = payloads(component, gs, judge)
        await direct(base_url, model, component, bodies, conc)  # warm-up: prefix cache, grammars
        await service(judge_url, component, gs, conc)
        modes = ("direct", "direct_pooled", "service")
        times: dict[str, list[float]] = {m: [] for m in modes}
        cpu = dict.fromkeys(modes, 0.0)
        kinds: Counter[str] = Counter()
        for i in range(rounds):
            # forward and reverse order in turn, so drifting load from other processes
            # hits every side alike
            for mode in modes if i % 4 in (0, 3) else modes[::-1]:
                if mode.startswith("direct"):
                    pool = 8 if mode == "direct_pooled" else None
                    c0 = time.process_time()
                    times[mode].append(await direct(base_url, model, component, bodies, conc, pool))
                    cpu[mode] += time.process_time() - c0
                else:
                    c0 = cpu_seconds(judge_pid)
                    elapsed, k = await service(judge_url, component, gs, conc)
                    cpu[mode] += cpu_seconds(judge_pid) - c0
                    times[mode].append(elapsed)
                    kinds.update(k)
        n = len(bodies)
        rate = {m: n * rounds / sum(times[m]) for m in modes}
        out: dict[str, Any] = {"items": n, "null_kinds": dict(kinds)}
        for m in modes:
            out[f"{m}_items_s"] = round(rate[m], 1)
            out[f"{m}_cpu_ms_per_item"] = round(1000 * cpu[m] / (n * rounds), 2)
        for base in ("direct", "direct_pooled"):
            pairs = [d / s for d, s in zip(times[base], times["service"], strict=True)]
            out[f"ratio_vs_{base}"] = round(rate["service"] / rate[base], 3)
            out[f"ratio_vs_{base}_pairs"] = [
                round(min(pairs), 2),
                round(statistics.median(pairs), 2),
                round(max(pairs), 2),
            ]
        results[component] = out
        log.info("%s: %s", component, results[component])
    await judge.aclose()
    return results


def run(
    items: int = 128,
    concurrency: int = 32,
    rounds: int = 8,
    base_url: str | None = None,
    model: str = "tiny",
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Measure both components; start the tiny model on vLLM unless ``base_url`` is given."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="bench-judge-"))
    procs: list[ManagedProcess] = []
    try:
        if base_url is None:
            model_dir = build(work / "tiny-model", GSM8K)
            vllm, base_url = start_vllm(model_dir, work / "vllm.log")
            procs.append(vllm)
            model = "tiny"
        port = free_port()
        env = {
            "JUDGE_BASE_URL": base_url,
            "JUDGE_MODEL": model,
            "JUDGE_MAX_CONCURRENCY": str(concurrency),
            "JUDGE_CONSTRAIN_LABELS": "true",
        }
        spec = service_process("judge", port, env=env, log_path=work / "judge.log")
        judge = _SameSession(spec.name, spec.argv, spec.env, spec.ready_url, spec.log_path)
        procs.append(judge.start())
        judge.wait_ready(60)
        load_before = _uptime()
        assert judge.proc is not None
        url = f"http://127.0.0.1:{port}"
        results = asyncio.run(
            _measure(base_url, model, url, judge.proc.pid, items, concurrency, rounds)
        )
        return {
            "concurrency": concurrency,
            "rounds": rounds,
            "load_before": load_before,
            "load_after": _uptime(),
            "cpus": os.cpu_count(),
            **results,
        }
    finally:
        for p in reversed(procs):
            p.stop(timeout=20)


def table(res: dict[str, Any]) -> str:
    """Ratios are service / direct items/s over all rounds (per-round min, median, max)."""
    rows = [
        "| component | items × rounds | direct, one client | direct, pools of 8 | judge service "
        "| service / direct (min, median, max) | service / direct pooled |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in ("verifier", "quality"):
        r = res[c]

        def ratio(base: str, r: dict[str, Any] = r) -> str:
            lo, med, hi = r[f"ratio_vs_{base}_pairs"]
            return f"**{r[f'ratio_vs_{base}']:.3f}** ({lo}, {med}, {hi})"

        rows.append(
            f"| judge_{c} | {r['items']} × {res['rounds']} | {r['direct_items_s']} items/s "
            f"({r['direct_cpu_ms_per_item']} ms CPU/item) | {r['direct_pooled_items_s']} "
            f"({r['direct_pooled_cpu_ms_per_item']}) | {r['service_items_s']} "
            f"({r['service_cpu_ms_per_item']}) | {ratio('direct')} | {ratio('direct_pooled')} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--items", type=int, default=128, help="items per round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per side")
    p.add_argument("--base-url", default=None, help="a running OpenAI-compatible server (/v1)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res = run(a.items, a.concurrency, a.rounds, a.base_url, a.model)
    print(json.dumps(res, indent=1))
    print(table(res))
    if a.json:
        record.write_result(a.json, res)


if __name__ == "__main__":
    main()
