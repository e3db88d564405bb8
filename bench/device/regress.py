"""Re-check every GPU headline in one device call, with the trainer's default settings.

Four parts, each a real run (no mocks), then one table against the figures recorded on the
same card (``bench/results/regress_<card>.json``):

1. ``learn``: ``bench.trainer.learn`` as published (200-step SFT warm start, GRPO through
   real verify + gateway: G=16, 512 rollouts a step, lr 5e-5, k3 KL beta 0.05), shortened
   to 300 GRPO steps; the greedy held-out accuracy (500 problems) must rise.
2. ``calc``: ``python -m arbiter.trainer env=calculator`` for a few multi-turn steps
   (the learning benchmark's 4.7 M-parameter model shape, GSM8K problems, the same
   services).
3. ``speed``: ``bench.trainer.speed`` at the Qwen2.5-1.5B config, ours against TRL 1.16's
   GRPOTrainer in one process (``bench/device/trainer_1p5b_gpu.sh``'s settings), shortened:
   128 new tokens instead of 512 (two compiled sampler buckets instead of five), one timed
   step after the warm-up ones on each side; completion tokens/s and peak memory of each.
4. ``embed``: ``bench.services.embedding`` on the GPU (float16 MiniLM, the service's defaults),
   shortened to 2 rounds; the service's texts/s and its ratio to raw ``model.encode``.

On the GPU, 1-3 run side by side (learn and calc are host-bound tiny models, speed is the
GPU-bound one; ``main`` says why), then 4 alone. Exit status 1 on a crash (a part's
non-zero exit, a missing result, too few steps) or a
figure outside its allowance against the recorded one (``CHECKS``: each allowance is the
run-to-run spread measured on the card, rounded up, and says why). ``--small`` (SMALL=1 in
``bench/device/regress.sh``) runs the same parts on a CPU at tiny sizes, a few steps each,
and checks that each runs (no recorded figures: CPU times in CI are noise); CI runs it.

    bash bench/device/regress.sh             # on the device; carry .carry/trainer and
                                             # .carry/embedding/minilm-fp16
    SMALL=1 PY=.venv/bin/python bash bench/device/regress.sh    # CPU, about 2 minutes
    python -m bench.device.regress --record bench/results/regress_h200.json   # new recorded figures
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from arbiter import gsm8k

REPO = Path(__file__).resolve().parents[2]

# figure -> (direction, allowance, unit, the spread measured). "min": value >= recorded -
# allowance ("pts") or recorded * (1 - allowance) ("rel"); "max" the other way. Each allowance
# is about twice the spread between runs on one card (other figures are shown, not checked).
CHECKS: dict[str, tuple[str, float, str, str]] = {
    "learn.accuracy_after": ("min", 6.0, "pts", "3 H200 runs: 33.4-36.2 %; 2.1 points s.e. each"),
    "learn.s_per_step": ("max", 0.15, "rel", "3 H200 runs: 0.340-0.350 s"),
    "calc.s_per_step": ("max", 0.50, "rel", "2 H200 runs: 0.333, 0.383 s (5 steps, host-bound)"),
    "speed.ratio": ("min", 0.20, "rel", "2 H200 calls: 2.47x, 2.26x (8 %)"),
    "speed.ours_tokens_per_s": ("min", 0.20, "rel", "2 H200 calls: 9,121, 8,148 (11 %)"),
    "speed.ours_peak_GiB": ("max", 0.03, "rel", "2 H200 calls: 13.13 GiB both"),
    "embed.texts_per_s": ("min", 0.20, "rel", "2 H200 calls: 3,310, 3,535 (7 %)"),
    "embed.ratio": ("min", 0.15, "rel", "2 H200 calls: 0.80, 0.83"),
}


def card() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


DEADLINE = [float("inf")]  # time.monotonic() by which every part has stopped (--budget)


def run(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> int:
    """``cmd`` in its own process group, output to ``log``, stopped after ``timeout`` s or at
    the run's deadline: an interrupt (so its ``finally`` stops the services it started),
    then a kill. -9: timed out."""
    timeout = max(1.0, min(timeout, DEADLINE[0] - time.monotonic()))
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                env=os.environ | (env or {}), start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return -9


def _steady_median(metrics: Path, key: str = "time/step") -> float | None:
    """Median of ``key`` over the train records, after the first two (compilation) when
    there are more than four."""
    if not metrics.exists():
        return None
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    vals = [r[key] for r in rows if r.get("kind") == "train" and key in r]
    vals = vals[2:] if len(vals) > 4 else vals
    return round(statistics.median(vals), 4) if vals else None


def part_learn(a: argparse.Namespace, out: dict[str, Any]) -> None:
    o = a.out / "learn"
    cmd = [sys.executable, "-m", "bench.trainer.learn", "--work", str(a.work / "learn"),
           "--out", str(o), "--corpus", str(a.corpus), "--steps", str(a.learn_steps),
           "--compare-steps", "0", "--tag", "regress"]  # fmt: skip
    if a.small:  # tiny shapes: the same code paths on two CPU cores
        cmd += ["--hidden", "64", "--layers", "2", "--heads", "1", "--sft-steps", "20",
                "--sft-check-every", "0", "--verify-workers", "2", "--timeout", "100",
                "rollouts_per_step=16", "group_size=8", "micro_batch_size=8",
                "max_new_tokens=12", "eval_problems=16", f"eval_every={a.learn_steps}"]  # fmt: skip
    else:
        cmd += ["--timeout", "370", f"eval_every={a.learn_steps}"]  # held-out: before and after
    rc = run(cmd, a.out / "learn.log", 140 if a.small else 420)
    res = _read(o / "trainer_learn_regress.json").get("grpo", {})
    out["learn"] = {
        "rc": rc if rc else res.get("rc", "no result"),
        "steps": res.get("steps", 0),
        "accuracy_before": _pct(res.get("accuracy_before")),
        "accuracy_after": _pct(res.get("accuracy_after")),
        "s_per_step": _steady_median(o / "metrics-learn_regress.jsonl"),
    }


def part_calc(a: argparse.Namespace, out: dict[str, Any]) -> None:
    from arbiter.tiny_model import build
    from bench.trainer.learn import _services

    w = a.work / "calc"
    w.mkdir(parents=True, exist_ok=True)
    shape = dict(hidden=64, layers=2, heads=1) if a.small else dict(hidden=256, layers=4, heads=4)
    model = build(w / "model", a.corpus, **shape)
    procs, url = _services(w, 2)
    rollouts = 16 if a.small else 64
    try:
        cmd = [sys.executable, "-m", "arbiter.trainer", f"model={model}",
               f"data_dir={a.corpus}", f"run_dir={w / 'run'}", f"gateway_url={url}",
               "env=calculator", "max_turns=3", f"steps={a.calc_steps}",
               f"rollouts_per_step={rollouts}", "group_size=8", f"micro_batch_size={rollouts // 2}",
               f"max_new_tokens={12 if a.small else 48}", "save_every=-1", "plot=false",
               "progress=false", "lr=1e-4"]  # fmt: skip
        rc = run(cmd, a.out / "calc.log", 120 if a.small else 200)
    finally:
        for p in procs:
            p.stop()
    metrics = w / "run" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    train = [r for r in rows if r.get("kind") == "train"]
    out["calc"] = {
        "rc": rc,
        "steps": len(train),
        "turns_mean": round(statistics.mean(r["turns/mean"] for r in train), 3) if train else None,
        "s_per_step": _steady_median(metrics),
    }


def part_speed(a: argparse.Namespace, out: dict[str, Any]) -> None:
    o = a.out / "speed"
    o.mkdir(parents=True, exist_ok=True)
    env = {"OUT": str(o)}
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
    res = _read(o / "trainer_speed.json")
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
    rc = run(cmd, a.out / "embed.log", 150 if a.small else 100)
    res = _read(js)
    svc: dict[str, Any] = next(iter(res.get("service", {}).values()), {})
    out["embed"] = {
        "rc": rc if rc else (0 if svc else "no result"),
        "texts_per_s": round(svc["texts_per_s"], 1) if svc else None,
        "ratio": round(svc["ratio"], 3) if svc else None,
    }


def _read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _pct(x: Any) -> float | None:
    return None if x is None else round(100 * float(x), 1)


def verdicts(a: argparse.Namespace, got: dict[str, Any], rec: dict[str, Any]) -> list[list[str]]:
    """Rows (figure, value, recorded, allowed, verdict); 'FAIL' marks a crash or regression."""
    rows = []
    want_steps = {"learn": a.learn_steps, "calc": a.calc_steps}
    for part, figs in got.items():
        for name, v in figs.items():
            key, r = f"{part}.{name}", rec.get(f"{part}.{name}")
            allowed, verdict = "", "ok"
            if name == "rc":
                verdict = "ok" if v == 0 else "FAIL (crash)"
                v = "exit 0" if v == 0 else f"exit {v}"
            elif name == "steps" and part in want_steps:
                allowed = f"= {want_steps[part]}"
                verdict = "ok" if v == want_steps[part] else "FAIL (stopped early)"
            elif v is None and a.small and name.endswith("peak_GiB"):
                verdict = "n/a (CPU)"
            elif v is None:
                verdict = "FAIL (missing)"
            elif key == "learn.accuracy_after" and not a.small:
                before = figs.get("accuracy_before") or 0.0
                verdict = "ok" if v > before else "FAIL (did not rise)"
                allowed = f"> {before}"
            if key in CHECKS and r is not None and v is not None and verdict == "ok":
                direction, allowance, unit, _ = CHECKS[key]
                if unit == "pts":
                    bound = r - allowance if direction == "min" else r + allowance
                else:
                    bound = r * (1 - allowance) if direction == "min" else r * (1 + allowance)
                ok = v >= bound if direction == "min" else v <= bound
                sign = ">=" if direction == "min" else "<="
                allowed = (allowed + "; " if allowed else "") + f"{sign} {bound:.4g}"
                verdict = "ok" if ok else "FAIL (regression)"
            rows.append([key, str(v), "" if r is None else str(r), allowed, verdict])
    return rows


def table(rows: list[list[str]], title: str) -> str:
    head = ["figure", "this run", "recorded", "allowed", "verdict"]
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU, tiny sizes (CI)")
    p.add_argument("--parts", default="learn,calc,speed,embed")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/regress_out")))
    p.add_argument("--work", type=Path, default=Path("/tmp/regress_work"))
    carry = REPO / ".carry" / "trainer"
    p.add_argument("--corpus", type=Path, default=carry / "gsm8k" if carry.exists()
                   else gsm8k.default_dir())  # fmt: skip
    p.add_argument("--embedding-model", type=Path,
                   default=REPO / ".carry" / "embedding" / "minilm-fp16")  # fmt: skip
    p.add_argument("--baseline", type=Path, default=None, help="default: by card")
    p.add_argument("--record", type=Path, default=None, help="write this run's figures here")
    p.add_argument("--budget", type=float, default=0, help="seconds for all parts (0: none)")
    a = p.parse_args(argv)
    if a.budget:  # the table must come out inside the device call's limit
        DEADLINE[0] = time.monotonic() + a.budget - 8
    a.learn_steps, a.calc_steps = (3, 2) if a.small else (300, 5)
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    name = card()
    got: dict[str, Any] = {}
    parts = a.parts.split(",")
    t0 = time.perf_counter()
    fns = {"learn": part_learn, "calc": part_calc, "speed": part_speed, "embed": part_embed}
    todo = [x for x in ("learn", "calc", "speed", "embed") if x in parts]
    # On the GPU the parts run in two phases so the table comes out inside one 10-minute call
    # on a fresh machine (compilation alone is ~50 s for learn and ~125 s for speed's first
    # step): learn, calc and speed side by side (learn and calc are host-bound tiny models,
    # speed is the GPU-bound one), then embed alone, since it measures throughput. The
    # recorded figures come from this same schedule, so like is compared with like. On a CPU
    # (--small) each part runs alone: two cores cannot host three trainers at once.
    phases = (
        [[x] for x in todo]
        if a.small
        else [[x for x in todo if x != "embed"], [x for x in todo if x == "embed"]]
    )
    for phase in filter(None, phases):
        threads = [threading.Thread(target=_guarded, args=(fns[x], a, got, x)) for x in phase]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    ordered: dict[str, Any] = {k: got[k] for k in ("learn", "calc", "speed", "embed") if k in got}
    base_path = a.baseline or REPO / "bench" / "results" / f"regress_{_slug(name)}.json"
    base = _read(base_path)
    rec = base.get("figures", {}) if base.get("card") == name and not a.small else {}
    rows = verdicts(a, ordered, rec)
    where = f"{base_path.name}, {base.get('recorded', '')}" if rec else "none for this card"
    title = (f"regress on {name}{' (SMALL: CPU, tiny sizes)' if a.small else ''}, "
             f"{time.perf_counter() - t0:.0f} s; recorded figures: {where}")  # fmt: skip
    text = table(rows, title)
    print(text, flush=True)
    flat = {f"{k}.{n}": v for k, figs in ordered.items() for n, v in figs.items()}
    summary = {"card": name, "figures": flat, "table": text.splitlines()}
    (a.out / "regress.json").write_text(json.dumps(summary, indent=1))
    if a.record:
        a.record.write_text(json.dumps({"card": name, "recorded": time.strftime("%Y-%m-%d"),
                                        "figures": flat}, indent=1) + "\n")  # fmt: skip
    return 1 if any(r[4].startswith("FAIL") for r in rows) else 0


def _guarded(fn: Any, a: argparse.Namespace, got: dict[str, Any], part: str) -> None:
    """A part that raises is a crash in the table, not the end of the run; its wall time is
    kept (informational)."""
    t = time.monotonic()
    try:
        fn(a, got)
    except Exception as e:
        got[part] = {"rc": f"{type(e).__name__}: {str(e)[:200]}"}
    got[part]["wall_s"] = round(time.monotonic() - t, 1)


def _slug(name: str) -> str:
    for key in ("H200", "H100", "A100"):
        if key in name:
            return key.lower()
    return "".join(c for c in name.lower() if c.isalnum()) or "cpu"


if __name__ == "__main__":
    raise SystemExit(main())
