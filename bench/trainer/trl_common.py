"""The parts of the TRL baseline (``bench.trainer.trl_baseline``) that no ``BENCH_*`` setting
changes: the device, its clock and peak memory, the package versions, the log line, and the
arithmetic prompts with their answers.

Each benchmark loads ``trl_baseline`` afresh to read its settings; it takes these from here,
imported once, and keeps them as its own names (``prompts_messages`` among them, which a
benchmark may replace on the loaded baseline: its phases look it up there at call time).
"""

from __future__ import annotations

import gc
import platform
import random
import time
from typing import Any

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def mem_reset() -> None:
    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def mem_peak() -> dict[str, float]:
    if DEV != "cuda":
        return {}
    return {
        "max_allocated_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "max_reserved_GiB": round(torch.cuda.max_memory_reserved() / 2**30, 2),
    }


def log(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def versions() -> dict[str, Any]:
    import importlib.metadata as md

    v: dict[str, Any] = {"python": platform.python_version()}
    for p in ["torch", "transformers", "accelerate", "trl", "datasets", "tokenizers", "pyarrow",
              "huggingface-hub", "fsspec", "dill", "multiprocess", "xxhash", "peft", "numpy",
              "pandas", "safetensors", "jinja2"]:  # fmt: skip
        try:
            v[p] = md.version(p)
        except Exception as e:
            v[p] = f"missing ({type(e).__name__})"
    if DEV == "cuda":
        props = torch.cuda.get_device_properties(0)
        v["gpu"] = props.name
        v["gpu_mem_GiB"] = round(props.total_memory / 2**30, 1)
        v["cuda"] = torch.version.cuda
    return v


def arith(rng: random.Random) -> tuple[str, str]:
    """One arithmetic question (the prompts when no GSM8K file is given) and its answer."""
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    op = rng.choice(["+", "-", "*"])
    ans = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}? Show your reasoning, then give the final answer.", str(ans)


def prompts_messages(n: int) -> list[dict[str, Any]]:
    """``n`` chat prompts (arithmetic questions) with their answers, the same on every call."""
    rng = random.Random(1)
    rows = []
    for _ in range(n):
        q, a = arith(rng)
        rows.append({"prompt": [{"role": "user", "content": q}], "answer": a})
    return rows


def checkpointing_on(model: Any) -> None:
    """Activation checkpointing by transformers' current name (``gradient_checkpointing_*``
    is deprecated from 5.2x), by the old one on an older transformers."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointing_arg(flag: bool | None) -> dict[str, Any]:
    """GRPOConfig's checkpointing setting, under the current name where transformers has it
    (the old one warns); None keeps TRL's default (on)."""
    import dataclasses

    from trl import GRPOConfig

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    if flag is None:
        flag = bool(fields["gradient_checkpointing"].default)
    name = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    return {name: flag}
