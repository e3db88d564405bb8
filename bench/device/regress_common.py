"""What the regression checks share (``bench.device.regress``: one GPU;
``bench.device.regress_multi``: two): their options, running a part as a stopped-in-time
subprocess (a learning run among them), reading its results, judging each figure against the
one recorded for the card, and the table.

A part's figures are a flat ``{name: value}`` under the part's name; ``verdict_rows`` turns
them into rows (figure, this run, recorded, allowed, verdict), where "FAIL" marks a crash, a
short run, a missing figure, a figure past a hard limit or a goal, or one outside its
allowance against the recorded figure (``checks``: each allowance is about twice the
spread measured between calls on one card).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter import gsm8k
from bench.record import write_result

REPO = Path(__file__).resolve().parents[2]
DEADLINE = [float("inf")]  # time.monotonic() by which every part has stopped (--budget)

# figure -> (direction, allowance, unit, the spread measured). "min": value >= recorded -
# allowance ("pts") or recorded * (1 - allowance) ("rel"); "max" the other way.
Checks = dict[str, tuple[str, float, str, str]]


@dataclass
class Rules:
    """How a check judges its figures (besides rc, which must be 0, and missing ones)."""

    checks: Checks  # against the recorded figure, within an allowance
    limits: dict[str, float] = field(default_factory=dict)  # figure -> at most this, always
    rise: dict[str, float] = field(default_factory=dict)  # figure -> must pass this and _before
    steps: dict[str, int] = field(default_factory=dict)  # part -> the steps it must run
    goals: dict[str, dict[str, float]] = field(default_factory=dict)  # card slug -> at most


def card() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def slug(name: str) -> str:
    for key in ("H200", "H100", "A100"):
        if key in name:
            return key.lower()
    return "".join(c for c in name.lower() if c.isalnum()) or "cpu"


def options(doc: str, parts: str, work: str, small: str) -> argparse.ArgumentParser:
    """The options of both checks: which parts, where their outputs and work go, the corpus,
    the recorded figures to judge against (by card unless given) and the time budget."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help=small)
    p.add_argument("--parts", default=parts)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/regress_out")))
    p.add_argument("--work", type=Path, default=Path(work))
    carry = REPO / ".carry" / "trainer" / "gsm8k"
    p.add_argument("--corpus", type=Path, default=carry if carry.exists() else gsm8k.default_dir())
    p.add_argument("--baseline", type=Path, default=None, help="default: by card")
    p.add_argument("--record", type=Path, default=None, help="write this run's figures here")
    p.add_argument("--budget", type=float, default=0, help="seconds for all parts (0: none)")
    return p


def begin(a: argparse.Namespace) -> None:
    """Set the deadline from ``--budget`` (the table must come out inside the call's limit)
    and make the output and work folders."""
    if a.budget:
        DEADLINE[0] = time.monotonic() + a.budget - 8
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)


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


def steady_median(metrics: Path, key: str = "time/step") -> float | None:
    """Median of ``key`` over the train records, after the first two (compilation) when
    there are more than four."""
    if not metrics.exists():
        return None
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    vals = [r[key] for r in rows if r.get("kind") == "train" and key in r]
    vals = vals[2:] if len(vals) > 4 else vals
    return round(statistics.median(vals), 4) if vals else None


def learn_run(
    a: argparse.Namespace,
    part: str,
    args: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    tag: str | None = None,
) -> dict[str, Any]:
    """``bench.trainer.learn`` for ``part`` (its own warm start and services) with ``args``
    (options, then ``key=value`` overrides), tagged ``tag`` (default: the part): its rc (the
    process's, else its summary's), steps, the summary's ``grpo`` and the steady median step."""
    tag = tag or part
    o = a.out / part
    cmd = [sys.executable, "-m", "bench.trainer.learn", "--work", str(a.work / part),
           "--out", str(o), "--corpus", str(a.corpus), "--compare-steps", "0", "--tag", tag,
           *args]  # fmt: skip
    rc = run(cmd, a.out / f"{part}.log", timeout, env)
    res = read(o / f"trainer_learn_{tag}.json").get("grpo", {})
    return {"rc": rc if rc else res.get("rc", "no result"), "steps": res.get("steps", 0),
            "grpo": res, "s_per_step": steady_median(o / f"metrics-learn_{tag}.jsonl")}  # fmt: skip


def accuracies(grpo: dict[str, Any]) -> dict[str, float | None]:
    """Greedy held-out accuracy before and after GRPO, in %."""
    return {"accuracy_before": pct(grpo.get("accuracy_before")),
            "accuracy_after": pct(grpo.get("accuracy_after"))}  # fmt: skip


def read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def pct(x: Any) -> float | None:
    return None if x is None else round(100 * float(x), 1)


def guarded(fn: Callable[..., None], a: argparse.Namespace, got: dict[str, Any], part: str) -> None:
    """A part that raises is a crash in the table, not the end of the run; its wall time is
    kept (informational)."""
    t = time.monotonic()
    try:
        fn(a, got)
    except Exception as e:
        got[part] = {"rc": f"{type(e).__name__}: {str(e)[:200]}"}
    got[part]["wall_s"] = round(time.monotonic() - t, 1)


def _against(v: float, r: float, check: tuple[str, float, str, str]) -> tuple[str, bool]:
    direction, allowance, unit, _ = check
    if unit == "pts":
        bound = r - allowance if direction == "min" else r + allowance
    else:
        bound = r * (1 - allowance) if direction == "min" else r * (1 + allowance)
    ok = v >= bound if direction == "min" else v <= bound
    return f"{'>=' if direction == 'min' else '<='} {bound:.4g}", ok


def verdict_rows(
    got: dict[str, Any], rec: dict[str, Any], rules: Rules, *, small: bool, card_slug: str = ""
) -> list[list[str]]:
    """Rows (figure, value, recorded, allowed, verdict). On a CPU (``small``) only crashes,
    step counts and missing figures are judged: CPU times in CI are noise."""
    rows = []
    goals = {} if small else rules.goals.get(card_slug, {})
    for part, figs in got.items():
        for name, v in figs.items():
            key, r = f"{part}.{name}", rec.get(f"{part}.{name}")
            allowed, verdict = "", "ok"
            if name == "rc":
                verdict = "ok" if v == 0 else "FAIL (crash)"
                v = "exit 0" if v == 0 else f"exit {v}"
            elif name == "steps" and part in rules.steps:
                allowed = f"= {rules.steps[part]}"
                verdict = "ok" if v == rules.steps[part] else "FAIL (stopped early)"
            elif v is None and small and name.endswith("peak_GiB"):
                verdict = "n/a (CPU)"
            elif v is None:
                verdict = "FAIL (missing)"
            elif key in rules.rise and not small:
                floor = max(figs.get(name.replace("_after", "_before")) or 0.0, rules.rise[key])
                verdict = "ok" if v > floor else "FAIL (did not rise)"
                allowed = f"> {floor}"
            elif key in rules.limits and not small:
                verdict = "ok" if v <= rules.limits[key] else "FAIL (over its limit)"
                allowed = f"<= {rules.limits[key]}"
            elif key in goals:
                verdict = "ok" if v <= goals[key] else "FAIL (past its goal)"
                allowed = f"<= {goals[key]} (goal)"
            if key in rules.checks and r is not None and v is not None and verdict == "ok":
                bound, ok = _against(v, r, rules.checks[key])
                allowed = (allowed + "; " if allowed else "") + bound
                verdict = "ok" if ok else "FAIL (regression)"
            rows.append([key, str(v), "" if r is None else str(r), allowed, verdict])
    return rows


def table(rows: list[list[str]], title: str) -> str:
    head = ["figure", "this run", "recorded", "allowed", "verdict"]
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report(
    a: argparse.Namespace, got: dict[str, Any], rules: Rules, name: str, prefix: str, secs: float
) -> int:
    """Judge ``got`` against ``bench/results/<prefix>_<card>.json`` (or ``a.baseline``), print
    the table, write ``a.out/<prefix>.json`` (and ``a.record`` when given, under the run
    header of ``bench.record``); 1 on any FAIL."""
    base_path = a.baseline or REPO / "bench" / "results" / f"{prefix}_{slug(name)}.json"
    base = read(base_path)
    rec = base.get("figures", {}) if base.get("card") == name and not a.small else {}
    rows = verdict_rows(got, rec, rules, small=a.small, card_slug=slug(name))
    where = f"{base_path.name}, {base.get('recorded', '')}" if rec else "none for this card"
    title = (f"{prefix} on {name}{' (SMALL: CPU, tiny sizes)' if a.small else ''}, "
             f"{secs:.0f} s; recorded figures: {where}")  # fmt: skip
    text = table(rows, title)
    print(text, flush=True)
    flat = {f"{k}.{n}": v for k, figs in got.items() for n, v in figs.items()}
    summary = {"card": name, "figures": flat, "table": text.splitlines()}
    write_result(a.out / f"{prefix}.json", summary)
    if a.record:
        recorded = {"card": name, "recorded": time.strftime("%Y-%m-%d"), "figures": flat}
        write_result(a.record, recorded)
    return 1 if any(r[4].startswith("FAIL") for r in rows) else 0
