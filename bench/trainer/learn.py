"""Learning demonstration on one GPU: SFT warm start, then GRPO through the real services.

1. ``trainer.sft``: generated GSM8K-format arithmetic problems (train/valid/test jsonl with
   correct references; sft.jsonl demonstrations, all correct by default; ``--slip-rate`` makes
   that share of the non-addition ones show a misconception), a small Qwen2 (4.7 M parameters,
   arbiter.tiny_model's tokenizer) and a fixed-length supervised pass (``--sft-steps``: a short
   one leaves a model that writes the format but is not yet sure of its sums). With
   ``--task tool``, ``trainer.tooluse``'s problems instead (products and 4-digit sums beyond
   the model's head; the calculator in ``--tool-share`` of the demonstrations), GRPO with
   ``env=calculator`` (or ``env=calculator-off``, the same prompts without the tool).
   ``--sft-only`` / ``--warm-start DIR`` share one warm start between runs side by side.
2. The verify service and the gateway (in-process LRU cache; no Redis on the device) are
   started with `arbiter serve` exactly as in production, on free loopback ports; with
   ``--embedding MODEL`` the embedding service too (on the GPU, float16), for recipes with the
   diversity component, and each evaluation then also samples 16 answers per problem:
   pass@1..16 and their mean pairwise distance.
3. ``python -m arbiter.trainer`` (the real CLI) runs GRPO on the generated problems with the
   gateway's ``gsm8k`` recipe (math_accuracy 1.0 + format 0.5), evaluating greedy held-out accuracy
   through the verify service before, during and after.
4. The summary (accuracy before/after, GRPO wall time, time split, tokens/s, reward wait as a
   share of step time) goes to ``$OUT/trainer_learn[_TAG].json``; curves, metrics.jsonl and the
   trainer log are copied to ``$OUT`` (``--tag`` suffixes every name).

The defaults are the README's honest run (200 SFT steps; GRPO lr 5e-5, G=16, 512 rollouts
per step, k3 KL beta 0.05 to the warm start; results in bench/results/experiments/trainer_notes.md);
``key=value`` overrides go to the trainer, e.g.

    python -m bench.trainer.learn [--steps 1500 --timeout 470 --compare-steps 40]
    python -m bench.trainer.learn --sft-steps 300 --steps 300 --compare-steps 0 --tag sft300 beta=0
    python -m bench.trainer.learn --task tool --sft-steps 600 --steps 200 env=calculator
    python -m bench.trainer.learn --embedding DIR --steps 400 recipe=gsm8k-diverse

``--small`` (or BENCH_SMALL=1) runs any of them on a CPU at the smallest sizes; every setting
side by side on one GPU: bench/device/trainer_tools_gpu.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import record

REPO = Path(__file__).resolve().parents[2]


def _ready(proc: Any, timeout: float) -> None:
    try:
        proc.start().wait_ready(timeout)
    except Exception as e:
        tail = proc.log_path.read_text(errors="replace")[-3000:] if proc.log_path else ""
        raise RuntimeError(f"{proc.name} did not start: {e}\n{tail}") from e


def _services(
    log_dir: Path, verify_workers: int, embedding: str = "", ors: bool = False
) -> tuple[list[Any], str]:
    """verify (+ the embedding service on ``embedding``'s model: on the GPU in float16 when
    there is one, as a user would run it; + with ``ors`` the environments service on a Redis
    of its own) and the gateway in front; their URL."""
    from arbiter.procs import free_port, redis_process, service_process

    vport, gport = free_port(), free_port()
    verify = service_process(
        "verify", vport, env={"VERIFY_WORKERS": str(verify_workers)},
        log_path=log_dir / "verify.log",
    )  # fmt: skip
    _ready(verify, 120)
    procs = [verify]
    # no REDIS_URL: the gateway falls back to its in-process LRU
    env = {"GATEWAY_VERIFY_URL": f"http://127.0.0.1:{vport}", "REDIS_URL": ""}
    if embedding:
        import torch

        gpu = torch.cuda.is_available()
        eport = free_port()
        eenv = {"EMBEDDING_DEVICE": "cuda" if gpu else "cpu",
                "EMBEDDING_DTYPE": "float16" if gpu else "float32"}  # fmt: skip
        if embedding != "default":  # else the service's own default (MiniLM from its wheel)
            eenv["EMBEDDING_MODEL"] = embedding
        emb = service_process("embedding", eport, env=eenv, log_path=log_dir / "embedding.log")
        _ready(emb, 180)
        procs.append(emb)
        env["GATEWAY_EMBEDDING_URL"] = f"http://127.0.0.1:{eport}"
    if ors:  # env=ors:calculator: the episodes through the gateway's /ors
        rport, nport = free_port(), free_port()
        redis = redis_process(rport, log_path=log_dir / "redis.log")
        _ready(redis, 20)
        nenv = {"ENVS_STATE_REDIS_URL": f"redis://127.0.0.1:{rport}/0",
                "ENVS_VERIFY_URL": env["GATEWAY_VERIFY_URL"]}  # fmt: skip
        envs = service_process("envs", nport, env=nenv, log_path=log_dir / "envs.log")
        _ready(envs, 60)
        procs += [envs, redis]
        env["GATEWAY_ENVS_URL"] = f"http://127.0.0.1:{nport}"
    gateway = service_process("gateway", gport, env=env, log_path=log_dir / "gateway.log")
    _ready(gateway, 60)
    return [gateway, *procs], f"http://127.0.0.1:{gport}"


def _summarise(run_dir: Path, wall_s: float) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    out: dict[str, Any] = {"grpo_wall_s": round(wall_s, 1), "steps": len(train)}
    if evals:
        out["eval"] = [(r["step"], r.get("eval/accuracy")) for r in evals]
        out["accuracy_before"] = evals[0].get("eval/accuracy")
        out["accuracy_after"] = evals[-1].get("eval/accuracy")
        out["accuracy_gain_points"] = round(
            100 * ((out["accuracy_after"] or 0.0) - (out["accuracy_before"] or 0.0)), 1
        )
        pass_at = sorted({k for r in evals for k in r if k.startswith("eval/pass@")})
        for key in [*pass_at, "eval/pairwise_distance"]:
            # sampled evaluation (eval_samples): pass@k and the spread within a problem
            if any(r.get(key) is not None for r in evals):
                out[key.removeprefix("eval/")] = [(r["step"], r.get(key)) for r in evals]
    if train:
        skip = min(2, len(train) - 1)  # the first steps include graph capture / warm-up
        steady = train[skip:]

        def tot(key: str) -> float:
            return float(sum(r.get(key, 0.0) for r in steady))

        step_s = tot("time/step")
        out["time_split_s_per_step"] = {
            k.split("/")[1]: round(tot(k) / len(steady), 4)
            for k in (
                "time/step",
                "time/generate",
                "time/logprobs",
                "time/reward_wait",
                "time/train",
                "time/reward_latency",
                "time/env",
            )
        }
        out["reward_wait_share"] = round(tot("time/reward_wait") / step_s, 4)
        # multi-turn: the environments' turns (in process, or the service's round trips); 6
        # places, as 4 rounded a fast run's share to 0
        out["env_wait_share"] = round(tot("time/env") / step_s, 6)
        out["action_tokens_per_s"] = round(tot("tokens/action") / step_s, 1)
        out["reward_first_last"] = [train[0].get("reward/mean"), train[-1].get("reward/mean")]
        out["completion_len_first_last"] = [
            train[0].get("completion_len/mean"), train[-1].get("completion_len/mean"),
        ]  # fmt: skip
        k = min(10, max(1, len(train) // 4))  # means of the first and the last k steps
        for key in ("tools/episode_frac", "tools/calls_per_episode", "tools/errors",
                    "turns/mean", "groups/pairwise_distance", "reward/mean"):  # fmt: skip
            vals = [r[key] for r in train if r.get(key) is not None]
            if vals:
                first, last = vals[:k], vals[-k:]
                out[f"{key}_first_last"] = [round(sum(first) / len(first), 4),
                                            round(sum(last) / len(last), 4)]  # fmt: skip
    return out


def _run_trainer(
    a: argparse.Namespace, settings: dict[str, Any], overrides: list[str], tag: str, timeout: int
) -> dict[str, Any]:
    """``python -m arbiter.trainer --config`` as a subprocess; the run's summary (+ $OUT files)."""
    import yaml

    run_dir = Path(settings["run_dir"])
    cfg_path = a.work / f"{tag}.yaml"
    cfg_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    launch = [sys.executable, "-m", "arbiter.trainer"]
    if a.nproc > 1:  # data parallel, one process per GPU, as a user would run it
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  f"--nproc_per_node={a.nproc}", "-m", "arbiter.trainer"]  # fmt: skip
    cmd = [*launch, "--config", str(cfg_path), *overrides]
    t1 = time.perf_counter()
    try:
        with (a.out / f"trainer-{tag}.log").open("w") as logf:
            rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout,
                                cwd=REPO).returncode  # fmt: skip
    except subprocess.TimeoutExpired:
        rc = -9
    wall = time.perf_counter() - t1
    shown = f"torchrun --nproc_per_node {a.nproc}" if a.nproc > 1 else "python"
    out: dict[str, Any] = {"cmd": f"{shown} -m arbiter.trainer --config {cfg_path.name}", "rc": rc}
    if (run_dir / "metrics.jsonl").exists():
        out |= _summarise(run_dir, wall)
        shutil.copy(run_dir / "metrics.jsonl", a.out / f"metrics-{tag}.jsonl")
    if (run_dir / "curves.png").exists():
        shutil.copy(run_dir / "curves.png", a.out / f"curves-{tag}.png")
    print(tag, json.dumps(out, default=str), flush=True)
    return out


SMALL_SHAPE = ["--hidden", "64", "--layers", "2", "--heads", "1", "--sft-steps", "20",
               "--sft-check-every", "0", "--verify-workers", "2"]  # fmt: skip
SMALL_SETTINGS = {"rollouts_per_step": 16, "group_size": 8, "micro_batch_size": 8,
                  "max_new_tokens": 12, "eval_problems": 8, "device": "cpu",
                  "cpu_threads": 2}  # fmt: skip
DIVERSITY_EVAL = {"components": [{"name": "math_accuracy", "weight": 1.0},
                                  {"name": "diversity", "weight": 0.0}]}  # fmt: skip
# the tool task: two clumsy calls and the answer need ~80 tokens, a head computation ~50;
# compile_train off: on an H100 the compiled training step's backward failed at the first
# multi-turn batch (Inductor: "shape '[1431, 256]' is invalid for input of size 1264")
TOOL_SETTINGS = {"max_new_tokens": 64, "max_turns": 3, "env": "calculator", "compile_train": False}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/trainer_learn"))
    p.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/trainer_learn_out"))
    )
    p.add_argument("--corpus", type=Path, default=REPO / ".carry" / "trainer" / "gsm8k")
    p.add_argument(
        "--task",
        choices=["arith", "tool"],
        default="arith",
        help="arith: trainer.sft's small sums (the published run); tool: trainer.tooluse's "
        "products and 4-digit sums, a warm start that calls the calculator in --tool-share of "
        "its demonstrations, GRPO with env=calculator (env=calculator-off: without the tool)",
    )
    p.add_argument("--tool-share", type=float, default=None, help="tool task (default 0.2)")
    p.add_argument(
        "--ors", action="store_true", help="tool task: env=ors:calculator, the episodes through "
        "the environments service behind the gateway (started here, with a Redis)"
    )  # fmt: skip
    p.add_argument(
        "--warm-start",
        type=Path,
        default=None,
        help="another run's --work: reuse its data and SFT model (same warm start for runs "
        "side by side) instead of training one",
    )
    p.add_argument("--sft-only", action="store_true", help="stop after the warm start")
    p.add_argument(
        "--embedding",
        default="",
        help="start the embedding service on this sentence-transformers model ('default': the "
        "service's own; GPU, float16 when there is one) behind the gateway, for recipes with "
        "the diversity component; held-out evaluation then also samples 16 per problem "
        "(pass@k, pairwise distance)",
    )
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument(
        "--slip-rate",
        type=float,
        default=0.0,
        help="share of warm-start demonstrations showing the misconception (see trainer.sft; "
        "0: all correct; the first published run used 0.6)",
    )
    p.add_argument("--sft-check-every", type=int, default=100)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=1500, help="GRPO steps")
    p.add_argument(
        "--compare-steps",
        type=int,
        default=40,
        help="then a short pipeline=false run to compare the reward wait (0: skip)",
    )
    p.add_argument("--verify-workers", type=int, default=8)
    p.add_argument("--nproc", type=int, default=1, help="GPUs: >1 runs the trainer under torchrun")
    p.add_argument("--timeout", type=int, default=470, help="kill the GRPO run after this")
    p.add_argument("--tag", default="", help="suffix for the files written to --out")
    p.add_argument(
        "--small",
        action="store_true",
        default=os.environ.get("BENCH_SMALL") == "1",
        help="CPU smoke sizes (BENCH_SMALL=1): the smallest model, 20 SFT steps, 16 rollouts "
        "of 12 tokens a step (the later options and overrides still apply)",
    )
    p.add_argument("overrides", nargs="*", help="extra trainer settings, key=value")
    raw = list(sys.argv[1:] if argv is None else argv)
    a = p.parse_intermixed_args(raw)  # key=value overrides may come between the options
    if a.small:  # the small shape first, so that options given explicitly win
        a = p.parse_intermixed_args(SMALL_SHAPE + raw)
    return a


def _warm_start(a: argparse.Namespace, res: dict[str, Any]) -> tuple[Path, Path]:
    """(data dir, SFT model dir): trained here, or another run's (``--warm-start``)."""
    from arbiter.trainer import sft, tooluse

    if a.warm_start is not None:
        prev = json.loads((a.warm_start / "warm_start.json").read_text())
        res["sft"] = prev | {"reused_from": str(a.warm_start)}
        return Path(prev["data"]), Path(prev["model"])
    t0 = time.perf_counter()
    if a.task == "tool":
        share = tooluse.TOOL_SHARE if a.tool_share is None else a.tool_share
        data = tooluse.write_dataset(a.work / "tool", 20000, 500, tool_share=share)
        res["tool_share"] = share
    else:
        data = sft.write_dataset(a.work / "arith", 20000, 500, slip_rate=a.slip_rate)
    corpus = a.corpus if a.corpus.exists() else None
    base = sft.build_base(a.work / "base", corpus, hidden=a.hidden, layers=a.layers,
                          heads=a.heads, seed=0)  # fmt: skip
    sft_dir = a.work / "sft"
    # the local check is single-turn: the tool task's is the trainer's step-0 evaluation
    check = a.sft_check_every if a.task == "arith" else 0
    res["sft"] = sft.train_sft(base, data, sft_dir, steps=a.sft_steps, lr=a.sft_lr,
                               check_every=check)  # fmt: skip
    res["sft"]["wall_s_with_data_and_tokenizer"] = round(time.perf_counter() - t0, 1)
    if a.task == "arith":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        m: Any = AutoModelForCausalLM.from_pretrained(sft_dir)
        m = m.to(dev)
        res["sft"]["local_greedy_accuracy_200"] = sft.greedy_accuracy(
            m, AutoTokenizer.from_pretrained(sft_dir), data, 200
        )
        del m
    res["sft"] |= {"data": str(data), "model": str(sft_dir), "task": a.task}
    (a.work / "warm_start.json").write_text(json.dumps(res["sft"], default=str))
    return data, sft_dir


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    import arbiter.services.gateway.app
    import arbiter.services.verify.app  # noqa: F401 - fail fast on a missing wheel, before the SFT

    a.out.mkdir(parents=True, exist_ok=True)
    if a.work.exists():
        shutil.rmtree(a.work)
    a.work.mkdir(parents=True)
    res: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv, "task": a.task}
    sfx = f"_{a.tag}" if a.tag else ""
    res["slip_rate"] = a.slip_rate  # share of misconception demonstrations in the warm start

    def dump() -> None:
        record.write_result(a.out / f"trainer_learn{sfx}.json", res)

    import torch

    res["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    data, sft_dir = _warm_start(a, res)
    print("sft", json.dumps(res["sft"], default=str), flush=True)
    dump()
    if a.sft_only:
        return

    procs, gateway_url = _services(a.work, a.verify_workers, a.embedding, a.ors)
    run_dir = a.work / "run"
    settings = {
        "model": str(sft_dir), "data_dir": str(data), "run_dir": str(run_dir),
        "gateway_url": gateway_url, "recipe": "gsm8k",
        "steps": a.steps, "rollouts_per_step": 512, "group_size": 16, "micro_batch_size": 256,
        "max_new_tokens": 48, "max_prompt_tokens": 256, "temperature": 1.0,
        "lr": 5.0e-5, "warmup_steps": 5, "beta": 0.05, "mu": 1,
        "eval_every": 100, "eval_problems": 500, "save_every": 0, "progress": False,
        "reward_concurrency": 32, "pipeline": True,
    }  # fmt: skip
    if a.task == "tool":
        settings |= TOOL_SETTINGS | ({"env": "ors:calculator"} if a.ors else {})
    if a.embedding:  # pass@k and the spread within a problem's samples, at each evaluation
        settings |= {"eval_samples": 16, "eval_recipe": DIVERSITY_EVAL}
    if a.small:
        settings |= SMALL_SETTINGS | ({"max_new_tokens": 24} if a.task == "tool" else {})
    res["trainer_settings"] = settings | {"overrides": a.overrides}
    try:
        res["grpo"] = _run_trainer(a, settings, a.overrides, "learn" + sfx, a.timeout)
        dump()
        if a.compare_steps:
            plain = settings | {"steps": a.compare_steps, "eval_every": 0, "pipeline": False,
                                "run_dir": str(a.work / "run-plain"), "plot": False}  # fmt: skip
            res["grpo_not_pipelined"] = _run_trainer(a, plain, a.overrides, "plain" + sfx, 240)
    finally:
        for proc in procs:
            proc.stop()
        for proc in procs:
            text = (a.work / f"{proc.name}.log").read_text(errors="replace")
            res[f"{proc.name}_log_tail"] = text[-1500:]
    dump()
    print(json.dumps({k: v for k, v in res.items() if k != "trainer_settings"}, indent=1,
                     default=str))  # fmt: skip


if __name__ == "__main__":
    main()
