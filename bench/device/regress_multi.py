"""Re-check the two-GPU headlines in one device call (a 2-GPU kind), with default settings.

Two parts, one after the other (each needs both GPUs), each a real run (no mocks), then one
table against the figures recorded on the same card (``bench/results/regress_multi_<card>.json``):

1. ``fsdp7b``: ``bench.trainer.fsdp`` as published (``bench/device/trainer_7b_fsdp_gpu.sh``):
   a random-init Qwen2.5-7B config, ``torchrun --nproc_per_node 2`` with fsdp=true, 8 GSM8K
   prompts x G=8 per GPU, 512 new tokens, 6 steps through real verify + gateway. The first
   step (two rollouts under ``pipeline=true``: it holds the sampler's compilation), the
   second, the steady s/step (steps 3-5), completion tokens/s and peak memory per GPU. On
   an H200 the first step must stay within 90 s and the steady step within 12 s (the goals:
   74 s and 12.2 s were recorded before the sampler compiled each attended length anew for
   every KV-cache size, 297 s and 141 s after).
2. ``ddp``: ``bench.trainer.learn --nproc 2`` (``bench/device/trainer_ddp_gpu.sh``): the
   learning benchmark's warm start, then 300 GRPO steps under torchrun over NCCL, 256
   rollouts per rank (the one-GPU run's 512 a step); greedy held-out accuracy must rise.

Exit status 1 on a crash, a short run, a missing figure, a goal missed or a figure outside its
allowance against the recorded one (``CHECKS``). ``--small`` (SMALL=1 in
``bench/device/regress_multi.sh``) runs both on a CPU with two gloo processes at tiny sizes
and checks that each runs (CPU times in CI are noise); CI runs it.

    bash bench/device/regress_multi.sh       # on a 2-GPU kind; carry .carry/trainer
    SMALL=1 PY=.venv/bin/python bash bench/device/regress_multi.sh     # CPU, a few minutes
    ... --record bench/results/regress_multi_h200.json                  # new recorded figures
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.device.regress_common import (
    Rules,
    accuracies,
    begin,
    card,
    guarded,
    learn_run,
    options,
    read,
    report,
    run,
)

# figure -> (direction, allowance, unit, the spread measured); see regress_common. Until a
# second call on the card measures the spread, the allowances are the one-GPU check's for the
# same kind of figure (its throughput figures varied 7-11 % between H200 calls).
CHECKS = {
    "fsdp7b.first_step_s": ("max", 0.25, "rel", "one call per card so far"),
    "fsdp7b.s_per_step": ("max", 0.15, "rel", "one call per card so far"),
    "fsdp7b.completion_tokens_per_s": ("min", 0.15, "rel", "one call per card so far"),
    "fsdp7b.peak_GiB": ("max", 0.03, "rel", "one call per card so far; allocator-exact"),
    "ddp.accuracy_after": ("min", 6.0, "pts", "the one-GPU learn part's: 33.4-36.2 %"),
    "ddp.s_per_step": ("max", 0.25, "rel", "one call per card so far"),
}
# card -> figure -> the most it may be (the goals for two H200s)
GOALS = {"h200": {"fsdp7b.first_step_s": 90.0, "fsdp7b.s_per_step": 12.0}}


def part_fsdp7b(a: argparse.Namespace, out: dict[str, Any]) -> None:
    o = a.out / "fsdp7b"
    cmd = [sys.executable, "-m", "bench.trainer.fsdp", "--work", str(a.work / "fsdp7b"),
           "--out", str(o), "--corpus", str(a.corpus), "--nproc", "2", "--tag", "7b",
           "--steps", str(a.steps["fsdp7b"])]  # fmt: skip
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    if a.small:  # the TRL baseline's tiny model on two gloo ranks
        env = {"BENCH_SMALL": "1"}
        cmd += ["--verify-workers", "1", "--timeout", "200", "device=cpu", "max_new_tokens=8",
                "rollouts_per_step=8", "micro_batch_size=4"]  # fmt: skip
    else:
        cmd += ["--timeout", "300"]
    rc = run(cmd, a.out / "fsdp7b.log", 260 if a.small else 350, env)
    res = read(o / "trainer_fsdp_7b.json")
    g = res.get("grpo", {})
    metrics = o / "metrics-fsdp_7b.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    step = [r.get("time/step") for r in rows if r.get("kind") == "train"] + [None, None]
    out["fsdp7b"] = {
        "rc": rc if rc else g.get("rc", "no result"),
        "steps": g.get("steps", 0),
        "first_step_s": _round(step[0]),
        "second_step_s": _round(step[1]),
        "s_per_step": g.get("steady", {}).get("s_per_step"),
        "completion_tokens_per_s": g.get("steady", {}).get("completion_tokens_per_s"),
        "peak_GiB": g.get("peak_allocated_GiB_per_gpu"),
        "model_build_s": res.get("model_build_s"),
    }


def part_ddp(a: argparse.Namespace, out: dict[str, Any]) -> None:
    n = a.steps["ddp"]
    args = ["--nproc", "2", "--steps", str(n)]
    if a.small:
        args += ["--small", "--sft-steps", "4", "--timeout", "200", "cpu_threads=1"]
    else:  # 256 rollouts per rank: the one-GPU run's 512 a step
        args += ["--timeout", "240", "rollouts_per_step=256"]
    r = learn_run(a, "ddp", [*args, f"eval_every={n}"], 300 if a.small else 280)
    out["ddp"] = {"rc": r["rc"], "steps": r["steps"], **accuracies(r["grpo"]),
                  "s_per_step": r["s_per_step"]}  # fmt: skip


def _round(x: Any) -> float | None:
    return None if x is None else round(float(x), 2)


def rules(a: argparse.Namespace) -> Rules:
    return Rules(CHECKS, rise={"ddp.accuracy_after": 0.0}, steps=dict(a.steps), goals=GOALS)


def main(argv: list[str] | None = None) -> int:
    p = options(__doc__ or "", "fsdp7b,ddp", "/tmp/regress_multi_work",
                "CPU, two gloo ranks, tiny sizes (CI)")  # fmt: skip
    a = p.parse_args(argv)
    begin(a)
    a.steps = {"fsdp7b": 5, "ddp": 3} if a.small else {"fsdp7b": 6, "ddp": 300}
    name = card()
    got: dict[str, Any] = {}
    t0 = time.perf_counter()
    fns = {"fsdp7b": part_fsdp7b, "ddp": part_ddp}
    for part in [x for x in fns if x in a.parts.split(",")]:  # each needs both GPUs
        guarded(fns[part], a, got, part)
    return report(a, got, rules(a), name, "regress_multi", time.perf_counter() - t0)


if __name__ == "__main__":
    raise SystemExit(main())
