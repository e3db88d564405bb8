"""The trainer at 7B: ``python -m arbiter.trainer`` under torchrun with ``fsdp=true``.

1. A random-init Qwen2 of a real config (``--shape``, default ``qwen2.5-7b``: hidden 3584,
   28 layers, 28 heads, 4 KV heads, intermediate 18,944, vocab 152,064), with the TRL
   baseline's offline tokenizer (``bench/trainer/trl_baseline.py``, as ``bench.trainer.speed``
   uses), is
   saved as bf16 safetensors (in a child process, so this one holds no GPU memory).
2. The verify service and the gateway are started with ``arbiter serve`` as in production
   (``bench.trainer.learn``'s services: gateway cache in-process, no Redis).
3. ``torchrun --nproc_per_node N -m arbiter.trainer --config configs/qwen2.5-7b-gsm8k-fsdp.yaml``
   on GSM8K, with the model, data, gateway and a short run (no evaluation, no checkpoint)
   set on the command line; ``key=value`` arguments override the config further.
4. The summary goes to ``$OUT/trainer_fsdp[_TAG].json`` (with the trainer's metrics.jsonl
   and log): s/step, completion tokens/s, the step's split, the reward wait, peak GPU memory
   per rank, and how far from the card's limits (``bench.trainer.phases.card_limits``:
   each rank's rollout time per decode step against (bf16 weights + KV cache) bytes / HBM
   bandwidth, and the train step's model FLOPs utilisation per GPU).

    python -m bench.trainer.fsdp --nproc 2 [--steps 6] [--corpus GSM8K_DIR] [key=value ...]
    CUDA_VISIBLE_DEVICES=0 python -m bench.trainer.fsdp --nproc 1 --model DIR fsdp=false

Results on two and one H200: docs/benchmarks/trainer.md.

``BENCH_SMALL=1`` (the TRL baseline's tiny shapes) with ``device=cpu`` runs it on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from arbiter import gsm8k
from bench import record

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "qwen2.5-7b-gsm8k-fsdp.yaml"


def build_model(shape: str, out: Path) -> None:
    """Random-init model of ``shape`` + the TRL baseline's tokenizer, saved to ``out``."""
    os.environ["BENCH_SHAPE"] = shape
    from bench.trainer.phases import load_baseline

    a = load_baseline()
    tok = a.build_tokenizer()
    model = a.build_model(tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print("model", shape, sum(p.numel() for p in model.parameters()), flush=True)


def summarise(run_dir: Path, settings: dict[str, Any], world: int) -> dict[str, Any]:
    """Times, memory and card limits over the steady steps: the first two are warm-up, and
    a pipelined run's last step samples nothing (no next batch), so it is left out too."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bench.trainer.phases import card_limits

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in rows if r.get("kind") == "train"]
    last = -1 if settings.get("pipeline") in (True, "true") and len(train) > 3 else None
    steady = train[min(2, len(train) - 1) : last] if train else []
    out: dict[str, Any] = {}
    if not steady:
        return out
    step_s = sum(r["time/step"] for r in steady)
    out["steady"] = {
        "steps": [r["step"] for r in steady],
        "s_per_step": round(step_s / len(steady), 3),
        "s_per_step_median": round(sorted(r["time/step"] for r in steady)[len(steady) // 2], 3),
        "completion_tokens_per_s": round(sum(r["tokens/action"] for r in steady) / step_s, 1),
        "reward_wait_share": round(sum(r["time/reward_wait"] for r in steady) / step_s, 5),
    } | {
        k.split("/")[1] + "_s": round(sum(r[k] for r in steady) / len(steady), 4)
        for k in ("time/generate", "time/logprobs", "time/reward_wait", "time/train",
                  "time/reward_latency")
    }  # fmt: skip
    if "mem/peak_allocated_gib" not in steady[0]:
        return out
    out["peak_allocated_GiB_per_gpu"] = round(max(r["mem/peak_allocated_gib"] for r in train), 2)
    out["peak_reserved_GiB_per_gpu"] = round(max(r["mem/peak_reserved_gib"] for r in train), 2)
    per_rank = int(settings["rollouts_per_step"])
    limit_rows = []
    for r in steady:
        seq = r["tokens/sequence"] / world  # prompt + completion tokens of one rank's batch
        limit_rows.append(
            {
                "generate_s": r["time/generate"],
                "decode_steps": r["decode_steps"],
                "train_s": r["time/train"],
                "seq_tokens": seq,
            }
        )
    last_row = steady[-1]
    prompt_len = round(last_row["tokens/sequence"] / world / per_rank - last_row["decode_steps"])
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(settings["model"]))
    out["prompt_tokens_padded"] = prompt_len
    out["limits_per_gpu"] = card_limits(
        meta, limit_rows, prompt_len=prompt_len, rows=per_rank, card=torch.cuda.get_device_name()
    ) if torch.cuda.is_available() else {"card": "cpu"}  # fmt: skip
    out["steady_steps"] = [
        {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
         if k.startswith(("time/", "mem/", "tokens", "decode", "step", "completion_len"))}
        for r in train
    ]  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/trainer_fsdp"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/trainer_fsdp_out")))
    p.add_argument("--corpus", type=Path, default=REPO / ".carry" / "trainer" / "gsm8k")
    p.add_argument("--shape", default="qwen2.5-7b", help="the TRL baseline's BENCH_SHAPE")
    p.add_argument("--model", type=Path, default=None, help="use this model (skip building one)")
    p.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nproc", type=int, default=2, help="GPUs (torchrun processes)")
    p.add_argument("--steps", type=int, default=6, help="GRPO steps (the first two: warm-up)")
    p.add_argument("--verify-workers", type=int, default=8)
    p.add_argument("--timeout", type=int, default=480, help="kill the trainer after this")
    p.add_argument("--tag", default="")
    p.add_argument("overrides", nargs="*", help="extra trainer settings, key=value")
    a = p.parse_args(argv)
    if not a.corpus.exists():
        a.corpus = gsm8k.default_dir()
    model_dir = a.model or a.work / "model"
    if a.build_only:
        build_model(a.shape, model_dir)
        return
    import yaml

    import arbiter.services.gateway.app  # noqa: F401 - fail fast on a missing wheel
    from bench.trainer.learn import _run_trainer, _services

    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    sfx = f"_{a.tag}" if a.tag else ""
    res: dict[str, Any] = {"argv": sys.argv[1:]}

    def dump() -> None:
        record.write_result(a.out / f"trainer_fsdp{sfx}.json", res)

    t0 = time.perf_counter()
    if a.model is None:
        cmd = [sys.executable, "-m", "bench.trainer.fsdp", "--build-only", "--work", str(a.work),
               "--shape", a.shape]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=REPO)
    res["model_build_s"] = round(time.perf_counter() - t0, 1)
    procs, gateway_url = _services(a.work, a.verify_workers)
    settings = yaml.safe_load(CONFIG.read_text()) | {
        "model": str(model_dir), "data_dir": str(a.corpus), "run_dir": str(a.work / "run"),
        "gateway_url": gateway_url, "steps": a.steps, "eval_every": 0, "save_every": -1,
        "progress": False, "plot": False,
    }  # fmt: skip
    res["trainer_settings"] = settings | {"overrides": a.overrides, "config": CONFIG.name}
    dump()
    try:
        res["grpo"] = _run_trainer(a, settings, a.overrides, "fsdp" + sfx, a.timeout)
        dump()
        merged = settings | dict(kv.split("=", 1) for kv in a.overrides)
        res["grpo"] |= summarise(Path(settings["run_dir"]), merged, a.nproc)
    finally:
        for proc in procs:
            proc.stop()
    dump()
    print(json.dumps({k: v for k, v in res.items() if k != "trainer_settings"}, default=str)[:6000])


if __name__ == "__main__":
    main()
