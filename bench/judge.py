"""Judge throughput: the judge service against direct calls to the same vLLM server.

Both sides send the very same chat-completion bodies (built by the judge's own payload
code) to one vLLM OpenAI server with the same number of requests in flight: *direct*
keeps ``concurrency`` requests open from one ``httpx.AsyncClient``; *service* starts the
judge with ``JUDGE_MAX_CONCURRENCY=concurrency`` and keeps enough groups of 8 in flight
to fill it. Rounds alternate direct/service (ABBA) so that load from other processes hits
both; the ratio is service / direct items/s over all rounds (also: the median of the
per-pair ratios, and CPU ms per item of the direct client and of the judge process).
Target ≥ 0.95.

    .venv/bin/python -m bench.judge [--items 128] [--concurrency 32] [--rounds 8]
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

from arbiter.procs import ManagedProcess, free_port, uvicorn_process
from arbiter.tiny_model import build
from proto.components import ComponentGroup
from proto.judge import QualityParams, VerifierParams, VerifierRequest
from services.judge.parsing import (
    JudgeReplyError,
    first_token_top_logprobs,
    label_probability,
    message_text,
    parse_quality,
)
from services.judge.scoring import Judge
from services.judge.settings import JudgeSettings

log = logging.getLogger("bench.judge")

REPO = Path(__file__).resolve().parents[1]
GSM8K = Path(os.environ.get("ARBITER_GSM8K_DIR", REPO.parent / "shared" / "data" / "gsm8k"))
GROUP = 8
VLLM_FLAGS = [
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
    "--max-logprobs", "-1", "--block-size", "32", "--enable-prompt-tokens-details",
    "--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}',
]  # fmt: skip


def groups(n_items: int) -> list[ComponentGroup]:
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
            ComponentGroup(
                id=f"g{k}", prompt=row["question"], reference=f"#### {value}", responses=responses
            )
        )
    return out


def payloads(component: str, gs: list[ComponentGroup], judge: Judge) -> list[dict[str, Any]]:
    if component == "quality":
        params = QualityParams()
        return [judge.quality_payload(g, r, params, True) for g in gs for r in g.responses]
    req = VerifierRequest(groups=gs, params=VerifierParams())
    return [judge.verifier_payload(g, r, req) for g in gs for r in g.responses]


async def direct(
    base_url: str, model: str, component: str, bodies: list[dict[str, Any]], conc: int
) -> float:
    """Seconds for ``bodies`` with ``conc`` requests in flight straight to the server, each
    reply read into a score as a caller would (same parsing functions as the service)."""
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    sem = asyncio.Semaphore(conc)
    async with httpx.AsyncClient(base_url=base_url + "/", limits=limits, timeout=300) as http:

        async def one(body: dict[str, Any]) -> None:
            async with sem:
                r = await http.post("chat/completions", json={"model": model, **body})
                r.raise_for_status()
                try:
                    if component == "quality":
                        parse_quality(message_text(r.json()), 5)
                    else:
                        label_probability(first_token_top_logprobs(r.json()))
                except JudgeReplyError:
                    pass

        start = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - start


async def service(
    judge_url: str, component: str, gs: list[ComponentGroup], conc: int
) -> tuple[float, Counter[str]]:
    """Seconds through the judge service; groups in flight enough to fill its semaphore."""
    in_flight = max(2, 2 * conc // GROUP)
    sem = asyncio.Semaphore(in_flight)
    kinds: Counter[str] = Counter()
    params: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=300) as http:

        async def one(g: ComponentGroup) -> None:
            async with sem:
                body = {"groups": [g.model_dump()], "params": params}
                r = await http.post(f"{judge_url}/v1/{component}", json=body)
                r.raise_for_status()
                for e in r.json()["groups"][0]["errors"]:
                    kinds[e["kind"]] += 1

        start = time.perf_counter()
        await asyncio.gather(*(one(g) for g in gs))
        return time.perf_counter() - start, kinds


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
    proc = ManagedProcess(
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


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
        times: dict[str, list[float]] = {"direct": [], "service": []}
        cpu = {"direct": 0.0, "service": 0.0}
        kinds: Counter[str] = Counter()
        for i in range(rounds):
            # ABBA order, so drifting load from other processes hits both sides alike
            for mode in ("direct", "service") if i % 4 in (0, 3) else ("service", "direct"):
                if mode == "direct":
                    c0 = time.process_time()
                    times[mode].append(await direct(base_url, model, component, bodies, conc))
                    cpu[mode] += time.process_time() - c0
                else:
                    c0 = _cpu_s(judge_pid)
                    elapsed, k = await service(judge_url, component, gs, conc)
                    cpu[mode] += _cpu_s(judge_pid) - c0
                    times[mode].append(elapsed)
                    kinds.update(k)
        n = len(bodies)
        d_rate = n * rounds / sum(times["direct"])
        s_rate = n * rounds / sum(times["service"])
        pairs = [d / s for d, s in zip(times["direct"], times["service"], strict=True)]
        results[component] = {
            "items": n,
            "direct_items_s": round(d_rate, 1),
            "service_items_s": round(s_rate, 1),
            "ratio": round(s_rate / d_rate, 3),
            "ratio_median_of_pairs": round(statistics.median(pairs), 3),
            "ratio_pairs_min_max": [round(min(pairs), 2), round(max(pairs), 2)],
            "direct_client_cpu_ms_per_item": round(1000 * cpu["direct"] / (n * rounds), 2),
            "judge_service_cpu_ms_per_item": round(1000 * cpu["service"] / (n * rounds), 2),
            "null_kinds": dict(kinds),
        }
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
        judge = uvicorn_process(
            "judge", "services.judge.app:create_app", port, env=env, log_path=work / "judge.log"
        )
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
    rows = [
        "| component | items × rounds | direct items/s | judge service items/s | ratio "
        "(median of pairs; range) | CPU ms/item: direct client, judge service |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in ("verifier", "quality"):
        r = res[c]
        lo, hi = r["ratio_pairs_min_max"]
        rows.append(
            f"| judge_{c} | {r['items']} × {res['rounds']} | {r['direct_items_s']} "
            f"| {r['service_items_s']} | **{r['ratio']:.3f}** ({r['ratio_median_of_pairs']:.2f}; "
            f"{lo}–{hi}) | {r['direct_client_cpu_ms_per_item']}, "
            f"{r['judge_service_cpu_ms_per_item']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--items", type=int, default=128, help="items per round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per side")
    p.add_argument("--base-url", default=None, help="a running OpenAI-compatible server (/v1)")
    p.add_argument("--model", default="tiny")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res = run(a.items, a.concurrency, a.rounds, a.base_url, a.model)
    print(json.dumps(res, indent=1))
    print(table(res))


if __name__ == "__main__":
    main()
