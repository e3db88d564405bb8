"""TRL's ``GRPOTrainer`` with vLLM in colocate mode: the settings TRL users turn on for speed
(``use_vllm=True, vllm_mode="colocate"``: a vLLM engine inside the trainer's process, on the
same card), for the TRL baseline's ``A_vllm`` and ``B_vllm`` phases and ``bench.trainer.speed``'s
``trl_vllm`` phase. The phase itself is the baseline's ``phase_trl`` (same model, shape,
prompts, reward and loss); this module gives it the GRPOConfig settings and times vLLM's part.

vLLM loads the model from a path: TRL hands it ``model.name_or_path``, the directory the
baseline saved the random-init model and tokenizer to (``MDIR``), so both engines start from
the same weights; TRL then copies the trained weights into vLLM before each rollout
(``sync_weights``, timed here apart from the generation).

TRL's other vLLM defaults stay as a TRL user gets them: the importance-sampling correction
(``vllm_importance_sampling_correction=True``: one more forward for the old log-probs each
step), no sleep mode, ``max_num_seqs`` = the generation batch. The phase's ``mem_peak`` (torch's
allocator) counts vLLM's weights and KV cache too: the engine allocates in the same process.

Environment: ``BENCH_VLLM_MEM`` (0.3, TRL's default): the card's share vLLM takes (weights,
KV cache, CUDA graphs); 0.3 of an 80 GiB H100 is 24 GiB, against ~5 GiB of KV cache for
256 rows x ~640 tokens at the Qwen2.5-1.5B shape and TRL's 15.6 GiB training peak beside it.
``BENCH_VLLM_MAX_LEN`` (default 2048): vLLM's max model length (prompt + completion).
On a CPU (vLLM's CPU build), ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 (GiB).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

MEM = float(os.environ.get("BENCH_VLLM_MEM", "0.3"))
MAX_LEN = int(os.environ.get("BENCH_VLLM_MAX_LEN", "2048"))


def colocate_args(tag: str) -> dict[str, Any]:
    """GRPOConfig's vLLM settings for a phase whose tag ends in ``_vllm`` (none for the others),
    and the process environment vLLM reads at start-up."""
    if not tag.endswith("_vllm"):
        return {}
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # FlashInfer does not travel to the lent GPU (bench/device/vllm_carry.sh); vLLM's
    # top-k/top-p sampler imports it unguarded unless this is 0
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": MEM,
        "vllm_max_model_length": MAX_LEN,
    }


SHOWN = ["vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length",
         "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
         "vllm_enable_sleep_mode", "vllm_model_impl"]  # fmt: skip


def time_vllm(
    trainer: Any, gen_times: list[float], res: dict[str, Any], sync: Callable[[], None]
) -> None:
    """Where TRL generates with vLLM: times its generation into ``gen_times`` (the phase's
    generate share) and its weight copies into ``res["sync_weights_times_s"]``, and records
    the vLLM settings. Nothing for a trainer without vLLM."""
    if not getattr(trainer, "use_vllm", False):
        return
    vg = trainer.vllm_generation
    res["vllm"] = {k: getattr(trainer.args, k, None) for k in SHOWN}
    res["vllm"]["version"] = _version("vllm")
    import torch

    if torch.cuda.is_available():  # the engine's share is in use from here on, KV cache included
        free, total = torch.cuda.mem_get_info()
        res["vllm"]["card_in_use_GiB_after_start"] = round((total - free) / 2**30, 2)
    sync_times: list[float] = []
    res["sync_weights_times_s"] = sync_times

    def timed(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            sync()
            t = time.perf_counter()
            out = fn(*a, **k)
            sync()
            into.append(round(time.perf_counter() - t, 4))
            return out

        return run

    vg.generate = timed(vg.generate, gen_times)
    vg.sync_weights = timed(vg.sync_weights, sync_times)


def _version(name: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        try:
            return md.version(name + "-cpu")
        except md.PackageNotFoundError:
            return "missing"
