"""A Qwen3-32B-config judge at full scale on one GPU: the judge service's ratio, then GRPO
with the judge in the loop.

    python3 -m bench.device.judge_32b      (bench/device/judge_32b.sh sets the path)

1. vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``, the flags the judge's docs
   name) serves a Qwen3-32B config with ``load_format=dummy`` (random weights: the GPU machine
   has no model files) and the byte-level BPE tokenizer of ``arbiter.tiny_model``. The
   embedding and head are the tokenizer's size (2,048 ids, not 151,936): 31.2 B of the model
   card's 32.8 B parameters, and every id the model can sample is one the server can
   detokenize (the judge reads ``top_logprobs``).
2. ``bench.services.judge`` against that server: the judge service against direct calls with
   the same bodies and the same requests in flight, at each of CONCURRENCY (default 64,256).
3. GRPO at the Qwen2.5-1.5B shape (random init, 32 GSM8K prompts x G=8, 512 new tokens) through
   the real gateway with recipe ``gsm8k-dj`` (math_accuracy + format from verify, judge_quality
   from the judge service in front of that server), ``pipeline=true``, on the same card: the
   reward wait as a share of the step, after the first two steps.

Writes ``$OUT/judge_32b.json`` under the ``bench.record`` header. Environment: OUT,
GPU_UTIL (vLLM's share of the card, 0.62), CONCURRENCY, ITEMS (per round, 512), ROUNDS (2),
STEPS (GRPO steps, 6), EAGER=1 (no CUDA graphs). SMALL=1 (a CPU with ``.venv-vllm``): the tiny
model on vLLM CPU, 16 items at concurrency 8, GRPO with the tiny model for 2 steps; with
VLLM_URL (``http://HOST:PORT/v1``, the tests' session server) the vLLM server already serving
the tiny model as ``tiny`` there, none started here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from arbiter import gsm8k
from arbiter.procs import ManagedProcess, free_port, service_process
from bench import record
from bench.device.vllm_check import SHAPES, build_model_dir, gpu_memory_used_mib
from bench.services import judge as judge_bench

SMALL = os.environ.get("SMALL") == "1"
QWEN3_32B: dict[str, Any] = dict(  # the Qwen3-32B model card's config
    hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=False, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=40960,
)  # fmt: skip
SERVED = "qwen3-32b"


def judge_model_dir(out: Path) -> Path:
    """Qwen3-32B's config with the tiny tokenizer's vocabulary."""
    from transformers import AutoTokenizer, Qwen3Config

    from arbiter import tiny_model

    tiny_model.build_tokenizer(out, tiny_model._corpus(gsm8k.default_dir()))
    tok = AutoTokenizer.from_pretrained(out)
    vocab = -(-len(tok) // 64) * 64
    Qwen3Config(
        **QWEN3_32B, architectures=["Qwen3ForCausalLM"], vocab_size=vocab, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, dtype="bfloat16",
    ).save_pretrained(out)  # fmt: skip
    return out


def start_server(mdir: Path, log: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(mdir),
        "--served-model-name", SERVED, "--load-format", "dummy", "--dtype", "bfloat16",
        "--max-model-len", "4096", "--gpu-memory-utilization", os.environ.get("GPU_UTIL", "0.62"),
        "--max-num-seqs", "256", "--host", "127.0.0.1", "--port", str(port),
        "--max-logprobs", "-1", "--block-size", "32", "--enable-prompt-tokens-details",
        "--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}',
    ]  # fmt: skip
    if os.environ.get("EAGER") == "1":
        argv.append("--enforce-eager")
    env = {"VLLM_NO_USAGE_STATS": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    proc = ManagedProcess("vllm", argv, env=env, ready_url=f"http://127.0.0.1:{port}/health",
                          log_path=log).start()  # fmt: skip
    try:
        proc.wait_ready(480)
    except Exception as e:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"vLLM did not start: {e}\n{tail}") from e
    return proc, f"http://127.0.0.1:{port}/v1"


def policy_dir(out: Path) -> Path:
    """The 1.5B shape with random weights, saved for ``python -m arbiter.trainer``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arbiter import tiny_model

    if SMALL:
        return Path(tiny_model.build(out, gsm8k.default_dir()))
    build_model_dir(out, SHAPES["qwen2.5-1.5b"])
    from transformers import AutoConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(out)  # the tokenizer is there too
    return out


def grpo(base_url: str, work: Path, steps: int) -> dict[str, Any]:
    """verify + judge + gateway as in production, then the trainer's CLI with gsm8k-dj."""
    vport, jport, gport = free_port(), free_port(), free_port()
    model = "tiny" if SMALL else SERVED
    procs = [
        service_process("verify", vport, {"VERIFY_WORKERS": "2" if SMALL else "8"},
                        work / "verify.log", ready_path="/readyz"),
        service_process("judge", jport, {"JUDGE_BASE_URL": base_url, "JUDGE_MODEL": model,
                                         "JUDGE_MAX_CONCURRENCY": "128"}, work / "judge.log"),
    ]  # fmt: skip
    try:
        for p in procs:
            p.start().wait_ready(180)
        gw = service_process("gateway", gport, {
            "GATEWAY_VERIFY_URL": f"http://127.0.0.1:{vport}",
            "GATEWAY_JUDGE_URL": f"http://127.0.0.1:{jport}", "REDIS_URL": ""},
            work / "gateway.log")  # fmt: skip
        procs.append(gw)
        gw.start().wait_ready(60)
        pdir = policy_dir(work / "policy")
        run_dir = work / "run"
        shape = (["rollouts_per_step=8", "group_size=4", "max_new_tokens=16",
                  "micro_batch_size=8"] if SMALL else
                 ["rollouts_per_step=256", "group_size=8", "max_new_tokens=512",
                  "micro_batch_size=8", "gradient_checkpointing=true",
                  "gradient_checkpointing_keep_layers=2", "logprob_keep_logits=true"])  # fmt: skip
        cmd = [sys.executable, "-m", "arbiter.trainer", f"model={pdir}",
               f"data_dir={gsm8k.default_dir()}", "recipe=gsm8k-dj",
               f"gateway_url=http://127.0.0.1:{gport}", f"steps={steps}", "pipeline=true",
               "reward_concurrency=32", "eval_every=0", "plot=false", "progress=false",
               "save_every=0", f"run_dir={run_dir}", *shape]  # fmt: skip
        t0 = time.perf_counter()
        with open(work / "trainer.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - t0
        if rc.returncode:
            tail = (work / "trainer.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"trainer exited {rc.returncode}:\n{tail}")
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
        train = [r for r in rows if r.get("kind") == "train"]
        steady = train[min(2, len(train) - 1) :]

        def mean(key: str) -> float:
            return round(sum(r.get(key, 0.0) for r in steady) / len(steady), 4)

        step_s = sum(r.get("time/step", 0.0) for r in steady)
        return {
            "steps": len(train), "wall_s": round(wall, 1),
            "s_per_step": mean("time/step"), "generate_s": mean("time/generate"),
            "train_s": mean("time/train"), "reward_wait_s": mean("time/reward_wait"),
            "reward_latency_s": mean("time/reward_latency"),
            "reward_wait_share": round(sum(r.get("time/reward_wait", 0.0) for r in steady)
                                       / step_s, 4),
            "reward_mean": [round(r.get("reward/mean", 0.0), 4) for r in train],
            "reward_null_frac": [r.get("reward/null_frac") for r in train],
        }  # fmt: skip
    finally:
        for p in reversed(procs):
            p.stop(timeout=20)


def _exit_on_term(signum: int, frame: object) -> None:
    # `timeout` sends SIGTERM: exit through the finally blocks, which stop vLLM and the
    # services (their own process groups would otherwise outlive this run and hold the card)
    raise SystemExit(f"signal {signum}")


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_term)
    out = Path(os.environ.get("OUT") or "/tmp/judge_32b_out")
    work = Path("/tmp/judge_32b_work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    body: dict[str, Any] = {"small_test": SMALL}
    server: ManagedProcess | None = None
    if SMALL:
        from arbiter.tiny_model import build

        base_url = os.environ.get("VLLM_URL", "")
        if not base_url:
            server, base_url = judge_bench.start_vllm(
                build(work / "tiny", gsm8k.default_dir()), work / "vllm.log"
            )
        model, concs, items, rounds = "tiny", [8], 16, 1
    else:
        t0 = time.perf_counter()
        server, base_url = start_server(judge_model_dir(work / "judge"), work / "vllm.log")
        body["server_start_s"] = round(time.perf_counter() - t0, 1)
        body["gpu_memory_used_mib_server"] = gpu_memory_used_mib()
        model = SERVED
        concs = [int(c) for c in os.environ.get("CONCURRENCY", "64,256").split(",") if c]
        items, rounds = int(os.environ.get("ITEMS", "512")), int(os.environ.get("ROUNDS", "2"))
    try:
        for c in concs:
            t0 = time.perf_counter()
            (work / f"judge_c{c}").mkdir()
            r = judge_bench.run(items, c, rounds, base_url, model, work / f"judge_c{c}")
            body[f"judge_c{c}"] = r | {"wall_s": round(time.perf_counter() - t0, 1)}
            print(judge_bench.table(r), flush=True)
            record.write_result(out / "judge_32b.json", body)
        body["grpo_gsm8k_dj"] = grpo(
            base_url, work, 2 if SMALL else int(os.environ.get("STEPS", "6"))
        )
        body["gpu_memory_used_mib_end"] = gpu_memory_used_mib()
    finally:
        if server is not None:
            server.stop(timeout=30)
        for log in work.glob("**/*.log"):
            shutil.copy(log, out / f"{log.parent.name}_{log.name}")
    record.write_result(out / "judge_32b.json", body)
    print(json.dumps(body, indent=1))


if __name__ == "__main__":
    main()
