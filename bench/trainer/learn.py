"""Learning demonstration on one GPU: SFT warm start, then GRPO through the real services.

1. ``trainer.sft``: generated GSM8K-format arithmetic problems (train/valid/test jsonl with
   correct references; sft.jsonl demonstrations, all correct by default; ``--slip-rate`` makes
   that share of the non-addition ones show a misconception), a small Qwen2 (4.7 M parameters,
   arbiter.tiny_model's tokenizer) and a fixed-length supervised pass (``--sft-steps``: a short
   one leaves a model that writes the format but is not yet sure of its sums).
2. The verify service and the gateway (in-process LRU cache; no Redis on the device) are
   started with `arbiter serve` exactly as in production, on free loopback ports.
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

REPO = Path(__file__).resolve().parents[2]


def _ready(proc: Any, timeout: float) -> None:
    try:
        proc.start().wait_ready(timeout)
    except Exception as e:
        tail = proc.log_path.read_text(errors="replace")[-3000:] if proc.log_path else ""
        raise RuntimeError(f"{proc.name} did not start: {e}\n{tail}") from e


def _services(log_dir: Path, verify_workers: int) -> tuple[list[Any], str]:
    from arbiter.procs import free_port, service_process

    vport, gport = free_port(), free_port()
    verify = service_process(
        "verify", vport, env={"VERIFY_WORKERS": str(verify_workers)},
        log_path=log_dir / "verify.log",
    )  # fmt: skip
    _ready(verify, 120)
    # no REDIS_URL: the gateway falls back to its in-process LRU
    env = {"GATEWAY_VERIFY_URL": f"http://127.0.0.1:{vport}", "REDIS_URL": ""}
    gateway = service_process("gateway", gport, env=env, log_path=log_dir / "gateway.log")
    _ready(gateway, 60)
    return [gateway, verify], f"http://127.0.0.1:{gport}"


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
            100 * (out["accuracy_after"] - out["accuracy_before"]), 1
        )
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
            )
        }
        out["reward_wait_share"] = round(tot("time/reward_wait") / step_s, 4)
        out["action_tokens_per_s"] = round(tot("tokens/action") / step_s, 1)
        out["reward_first_last"] = [train[0].get("reward/mean"), train[-1].get("reward/mean")]
        out["completion_len_first_last"] = [
            train[0].get("completion_len/mean"), train[-1].get("completion_len/mean"),
        ]  # fmt: skip
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/trainer_learn"))
    p.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/trainer_learn_out"))
    )
    p.add_argument("--corpus", type=Path, default=REPO / ".carry" / "trainer" / "gsm8k")
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
    p.add_argument("overrides", nargs="*", help="extra trainer settings, key=value")
    a = p.parse_args(argv)
    import arbiter.services.gateway.app
    import arbiter.services.verify.app  # noqa: F401 - fail fast on a missing wheel, before the SFT
    from arbiter.trainer.sft import build_base, greedy_accuracy, train_sft, write_dataset

    a.out.mkdir(parents=True, exist_ok=True)
    if a.work.exists():
        shutil.rmtree(a.work)
    a.work.mkdir(parents=True)
    res: dict[str, Any] = {"argv": sys.argv[1:]}
    sfx = f"_{a.tag}" if a.tag else ""
    res["slip_rate"] = a.slip_rate  # share of misconception demonstrations in the warm start

    def dump() -> None:
        (a.out / f"trainer_learn{sfx}.json").write_text(json.dumps(res, indent=1, default=str))

    import torch

    res["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    data = write_dataset(a.work / "arith", 20000, 500, slip_rate=a.slip_rate)
    corpus = a.corpus if a.corpus.exists() else None
    base = build_base(a.work / "base", corpus, hidden=a.hidden, layers=a.layers, heads=a.heads,
                      seed=0)  # fmt: skip
    sft_dir = a.work / "sft"
    res["sft"] = train_sft(base, data, sft_dir, steps=a.sft_steps, lr=a.sft_lr,
                           check_every=a.sft_check_every)  # fmt: skip
    res["sft"]["wall_s_with_data_and_tokenizer"] = round(time.perf_counter() - t0, 1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m: Any = AutoModelForCausalLM.from_pretrained(sft_dir)
    m = m.to(dev)
    res["sft"]["local_greedy_accuracy_200"] = greedy_accuracy(
        m, AutoTokenizer.from_pretrained(sft_dir), data, 200
    )
    del m
    print("sft", json.dumps(res["sft"]), flush=True)
    dump()

    procs, gateway_url = _services(a.work, a.verify_workers)
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
        for name in ("verify", "gateway"):
            text = (a.work / f"{name}.log").read_text(errors="replace")
            res[f"{name}_log_tail"] = text[-1500:]
    dump()
    print(json.dumps({k: v for k, v in res.items() if k != "trainer_settings"}, indent=1,
                     default=str))  # fmt: skip


if __name__ == "__main__":
    main()
