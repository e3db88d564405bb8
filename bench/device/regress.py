"""Re-check every GPU headline in one device call, with the trainer's default settings.

Five parts, each a real run (no mocks), then one table against the figures recorded on the
same card (``bench/results/regress_<card>.json``):

1. ``learn``: ``bench.trainer.learn`` as published (200-step SFT warm start, GRPO through
   real verify + gateway: G=16, 512 rollouts a step, lr 5e-5, k3 KL beta 0.05), shortened
   to 300 GRPO steps; the greedy held-out accuracy (500 problems) must rise.
2. ``tool``: ``bench.trainer.learn --task tool``: the tool-use warm start (the calculator
   in 20 % of its demonstrations; greedy held-out accuracy < 10 %), 60 GRPO steps with
   ``env=calculator`` (multi-turn); held-out accuracy must pass 60 % (99.2 % at step 100 in
   the published run), and the share of episodes that call the tool is shown.
3. ``diverse``: ``bench.trainer.learn --embedding``: the learning benchmark's warm start, 60
   GRPO steps with recipe ``gsm8k-diverse``, the embedding service on the GPU; pass@16 and
   the pairwise distance of held-out samples, and the reward wait, which must stay under
   5 % of the step (the embedding service in the loop).
4. ``speed``: ``bench.trainer.speed`` at the Qwen2.5-1.5B config, ours against TRL 1.16's
   GRPOTrainer in one process (``bench/device/trainer_1p5b_gpu.sh``'s settings), shortened:
   128 new tokens instead of 512 (two attended lengths instead of five), one timed
   step after the warm-up ones on each side; completion tokens/s and peak memory of each.
5. ``embed``: ``bench.services.embedding`` on the GPU (float16 MiniLM, the service's defaults),
   shortened to 2 rounds; the service's texts/s and its ratio to raw ``model.encode``.

On one GPU, 1-3 run side by side (host-bound tiny models), then 4 alone and 5 alone, since
they measure throughput; with two GPUs, 4 runs on the second beside 1-3 on the first, then 5
alone (``schedule`` says why). Exit status 1 on a crash (a part's
non-zero exit, a missing result, too few steps) or a figure outside its allowance against
the recorded one (``CHECKS``: each allowance is the run-to-run spread measured on the
card, rounded up, and says why; ``bench.device.regress_common`` judges). ``--small`` (SMALL=1 in
``bench/device/regress.sh``) runs the same parts on a CPU at tiny sizes, a few steps each,
and checks that each runs (no recorded figures: CPU times in CI are noise); CI runs it.

    bash bench/device/regress.sh             # on the device; carry .carry/trainer and
                                             # .carry/embedding/minilm-fp16
    SMALL=1 PY=.venv/bin/python bash bench/device/regress.sh    # CPU, about 2 minutes
    python -m bench.device.regress --record bench/results/regress_h200.json   # new recorded figures
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.device.regress_common import (
    REPO,
    Rules,
    accuracies,
    begin,
    card,
    guarded,
    learn_run,
    options,
    pct,
    read,
    report,
    run,
    verdict_rows,
)

# figure -> (direction, allowance, unit, the spread measured). "min": value >= recorded -
# allowance ("pts") or recorded * (1 - allowance) ("rel"); "max" the other way. Each allowance
# is about twice the spread between runs on one card (other figures are shown, not checked).
CHECKS: dict[str, tuple[str, float, str, str]] = {
    "learn.accuracy_after": ("min", 6.0, "pts", "3 H200 runs: 33.4-36.2 %; 2.1 points s.e. each"),
    "learn.s_per_step": ("max", 0.15, "rel", "3 H200 runs: 0.340-0.350 s"),
    # at 60 steps: 99.4 % (H100, the part alone), 66.8 % (H200, beside learn/diverse/speed)
    "tool.accuracy_after": ("min", 35.0, "pts", "2 runs: 99.4 %, 66.8 % at step 60"),
    "tool.s_per_step": ("max", 0.50, "rel", "H100 alone 1.59 s; H200 side by side 1.31 s"),
    "diverse.s_per_step": ("max", 0.50, "rel", "H100 alone 0.71 s; H200 side by side 0.54 s"),
    "speed.ratio": ("min", 0.20, "rel", "2 H200 calls: 2.47x, 2.26x (8 %)"),
    "speed.ours_tokens_per_s": ("min", 0.20, "rel", "2 H200 calls: 9,121, 8,148 (11 %)"),
    "speed.ours_peak_GiB": ("max", 0.03, "rel", "2 H200 calls: 13.13 GiB both"),
    # host-bound (tokenizing, HTTP): the same card's calls spread widely; the service's own
    # cost is embed.ratio (to raw model.encode in the same call), which stays tight
    "embed.texts_per_s": ("min", 0.45, "rel", "H200: 3,310-4,685; H100: 4,068-6,519 texts/s"),
    "embed.ratio": ("min", 0.35, "rel", "H200: 0.80-0.87; 7 H100 calls: 0.73-1.11"),
}


# % held-out greedy accuracy the tool part must pass at its 60 steps: a clear rise from the warm
# start's < 1 %. Not the full run's 60 % goal (met at step 100, docs/benchmarks/trainer.md): two
# 60-step runs gave 99.4 % and 66.8 %, too wide a spread to hold a shortened run to it.
TOOL_GOAL = 30.0
# figure -> the most it may be, whatever was recorded (a goal, not a measured spread)
LIMITS = {"diverse.reward_wait_share": 0.05}


def rules(a: argparse.Namespace) -> Rules:
    return Rules(CHECKS, LIMITS, {"learn.accuracy_after": 0.0, "tool.accuracy_after": TOOL_GOAL},
                 {"learn": a.learn_steps, **a.steps})  # fmt: skip


def verdicts(a: argparse.Namespace, got: dict[str, Any], rec: dict[str, Any]) -> list[list[str]]:
    """Rows (figure, value, recorded, allowed, verdict); 'FAIL' marks a crash or regression."""
    return verdict_rows(got, rec, rules(a), small=a.small)


def part_learn(a: argparse.Namespace, out: dict[str, Any]) -> None:
    args = ["--steps", str(a.learn_steps)]
    if a.small:  # tiny shapes: the same code paths on two CPU cores
        args += ["--hidden", "64", "--layers", "2", "--heads", "1", "--sft-steps", "20",
                 "--sft-check-every", "0", "--verify-workers", "2", "--timeout", "100",
                 "rollouts_per_step=16", "group_size=8", "micro_batch_size=8",
                 "max_new_tokens=12", "eval_problems=16"]  # fmt: skip
    else:
        args += ["--timeout", "370"]
    args.append(f"eval_every={a.learn_steps}")  # held-out: before and after
    timeout = 140 if a.small else 420
    r = learn_run(a, "learn", args, timeout, a.env.get("learn"), tag="regress")
    out["learn"] = {"rc": r["rc"], "steps": r["steps"], **accuracies(r["grpo"]),
                    "s_per_step": r["s_per_step"]}  # fmt: skip


def _learn_setting(
    a: argparse.Namespace, part: str, extra: list[str], gpu_timeout: int
) -> dict[str, Any]:
    """``bench.trainer.learn`` with ``extra`` for ``a.steps[part]`` steps (``learn_run``)."""
    args = ["--steps", str(a.steps[part]), "--verify-workers", "2" if a.small else "3",
            *(["--small", "--timeout", "100"] if a.small else ["--timeout", str(gpu_timeout - 60)]),
            *extra, f"eval_every={a.steps[part]}"]  # fmt: skip
    return learn_run(a, part, args, 240 if a.small else gpu_timeout, a.env.get(part))


def _last(pairs: Any) -> Any:
    return pairs[-1][1] if pairs else None


def part_tool(a: argparse.Namespace, out: dict[str, Any]) -> None:
    """Tool use learned by GRPO (``--task tool``: the warm start calls the calculator in 20 %
    of its demonstrations; env=calculator): greedy held-out accuracy must rise past 60 %."""
    extra = ["--task", "tool"] + (["--sft-steps", "600"] if not a.small else [])
    r = _learn_setting(a, "tool", extra, 330)
    g = r.pop("grpo")
    share = g.get("tools/episode_frac_first_last") or [None, None]
    out["tool"] = r | accuracies(g) | {
        "tool_share_first": share[0], "tool_share_last": share[1],
        "turns_last": (g.get("turns/mean_first_last") or [None, None])[1],
    }  # fmt: skip


def part_diverse(a: argparse.Namespace, out: dict[str, Any]) -> None:
    """The diversity reward in the loop: recipe gsm8k-diverse with the embedding service on
    the GPU, pass@16 and the pairwise distance of held-out samples before and after; the
    reward wait with the embedding service in the loop must stay under 5 % of the step."""
    model = "default" if a.small else str(a.embedding_model)
    extra = ["--embedding", model, "recipe=gsm8k-diverse"]
    if a.small and out.get("learn", {}).get("rc") == 0:  # the parts ran one after the other:
        extra += ["--warm-start", str(a.work / "learn")]  # learn's warm start, the same one
    r = _learn_setting(a, "diverse", extra, 330)
    g = r.pop("grpo")
    p16 = g.get("pass@16") or g.get("pass@4") or []
    out["diverse"] = r | {
        "accuracy_after": pct(g.get("accuracy_after")),
        "pass16_before": pct(p16[0][1]) if p16 else None,
        "pass16_after": pct(_last(p16)),
        "pairwise_after": _last(g.get("pairwise_distance")),
        "reward_wait_share": g.get("reward_wait_share"),
    }


def part_speed(a: argparse.Namespace, out: dict[str, Any]) -> None:
    o = a.out / "speed"
    o.mkdir(parents=True, exist_ok=True)
    env = {"OUT": str(o)} | a.env.get("speed", {})
    cmd = [
        sys.executable,
        "-m",
        "bench.trainer.speed",
        "--phases",
        "ours,trl",
        "--steps",
        "1",
        "--sampler-modes",
        "",
    ]
    if a.small:  # the TRL baseline's tiny model, 2 of its short arithmetic prompts x 8
        env |= {"BENCH_SMALL": "1", "BENCH_PROMPTS": "2", "BENCH_G": "8"}
        cmd += ["--micro-batch", "16", "--trl-batch", "16", "--logprob-chunk", "64"]
    else:  # bench/device/trainer_1p5b_gpu.sh's settings, 128 new tokens, GSM8K prompts
        cmd += ["--gsm8k", str(a.corpus / "train.jsonl")]
        env |= {"BENCH_SHAPE": "qwen2.5-1.5b", "BENCH_PROMPTS": "32", "BENCH_G": "8",
                "BENCH_NEW": "128", "BENCH_TRL_BS": "16"}  # fmt: skip
        cmd += ["--micro-batch", "8", "--gradient-checkpointing", "--keep-layers", "2",
                "--keep-logits", "--free-sampler-cache", "--trl-batch", "16"]  # fmt: skip
    rc = run(cmd, a.out / "speed.log", 120 if a.small else 340, env)
    res = read(o / "trainer_speed.json")
    ours, trl = res.get("ours", {}), res.get("trl", {})
    got = ours.get("completion_tokens_per_s"), trl.get("completion_tokens_per_s")
    out["speed"] = {
        "rc": rc or ours.get("error") or trl.get("error") or (0 if all(got) else "no result"),
        "ours_tokens_per_s": got[0],
        "trl_tokens_per_s": got[1],
        "ratio": round(got[0] / got[1], 3) if all(got) else None,
        "ours_s_per_step": ours.get("s_per_step"),
        "trl_s_per_step": trl.get("s_per_step_steady"),
        "ours_peak_GiB": ours.get("max_allocated_GiB"),
        "trl_peak_GiB": trl.get("mem_peak", {}).get("max_allocated_GiB"),
    }


def part_embed(a: argparse.Namespace, out: dict[str, Any]) -> None:
    js = a.out / "embed.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.services.embedding",
        "--gsm8k",
        str(a.corpus),
        "--json",
        str(js),
    ]
    if a.small:
        cmd += ["--device", "cpu", "--rounds", "1", "--per-client", "1", "--clients", "4",
                "--client-procs", "1", "--batch-sizes", "16"]  # fmt: skip
    else:
        cmd += ["--device", "cuda", "--dtype", "float16", "--rounds", "1", "--per-client", "12",
                "--batch-sizes", "512", "--model", str(a.embedding_model)]  # fmt: skip
    rc = run(cmd, a.out / "embed.log", 150 if a.small else 100, a.env.get("embed"))
    res = read(js)
    svc: dict[str, Any] = next(iter(res.get("service", {}).values()), {})
    out["embed"] = {
        "rc": rc if rc else (0 if svc else "no result"),
        "texts_per_s": round(svc["texts_per_s"], 1) if svc else None,
        "ratio": round(svc["ratio"], 3) if svc else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = options(__doc__ or "", "learn,tool,diverse,speed,embed", "/tmp/regress_work",
                "CPU, tiny sizes (CI)")  # fmt: skip
    p.add_argument("--embedding-model", type=Path,
                   default=REPO / ".carry" / "embedding" / "minilm-fp16")  # fmt: skip
    a = p.parse_args(argv)
    begin(a)
    a.learn_steps = 3 if a.small else 300
    a.steps = {"tool": 2, "diverse": 2} if a.small else {"tool": 60, "diverse": 60}
    name = card()
    got: dict[str, Any] = {}
    parts = a.parts.split(",")
    t0 = time.perf_counter()
    fns = {"learn": part_learn, "tool": part_tool, "diverse": part_diverse, "speed": part_speed,
           "embed": part_embed}  # fmt: skip
    todo = [x for x in fns if x in parts]
    lanes_of = schedule(todo, a.small, 0 if a.small else gpu_count())
    a.env = {x: {"CUDA_VISIBLE_DEVICES": gpu} for phase in lanes_of for gpu, lane in phase
             if gpu is not None for x in lane}  # fmt: skip
    for phase in lanes_of:
        threads = [threading.Thread(target=_lane, args=(lane, fns, a, got)) for _, lane in phase]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    ordered: dict[str, Any] = {k: got[k] for k in fns if k in got}
    return report(a, ordered, rules(a), name, "regress", time.perf_counter() - t0)


def _lane(lane: list[str], fns: dict[str, Any], a: argparse.Namespace, got: dict) -> None:
    for part in lane:  # one after the other
        guarded(fns[part], a, got, part)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


Lane = tuple[str | None, list[str]]  # (CUDA_VISIBLE_DEVICES or None: inherited, its parts in order)


def schedule(parts: list[str], small: bool, gpus: int = 1) -> list[list[Lane]]:
    """The phases, each a list of lanes run side by side (a lane's parts one after the other).

    On one GPU: learn, tool and diverse together (host-bound tiny models), then speed alone
    and embed alone, since they measure throughput: beside the others, speed's timed steps
    took 3.97 and 5.84 s instead of ~3.6 (its ratio 1.75x, 2.57x alone). With speed's
    compile ~30 s, the table comes out inside one 10-minute call on a fresh machine.
    With two GPUs or more: the same three on the first GPU while speed runs alone on the
    second (the host has twice the cores), then embed alone: it is host-bound (tokenizing,
    HTTP), and beside the three trainers its ratio to raw encode fell to 0.73 (0.96 alone).
    The call takes about as long as the learn part and embed (~5 minutes instead of ~9).
    On a CPU (``small``) each part runs alone: two cores cannot host three trainers at once."""
    if small:
        return [[(None, [x])] for x in parts]
    host = [x for x in parts if x in ("learn", "tool", "diverse")]
    alone = [x for x in parts if x in ("speed", "embed")]
    if gpus >= 2 and "speed" in alone:
        lanes: list[Lane] = [("0", [x]) for x in host]
        lanes.append(("1", ["speed"]))
        return [lanes] + [[(None, [x])] for x in alone if x != "speed"]
    together: list[Lane] = [(None, [x]) for x in host]
    phases: list[list[Lane]] = [together] if together else []
    for x in alone:
        phases.append([(None, [x])])
    return phases


if __name__ == "__main__":
    raise SystemExit(main())
