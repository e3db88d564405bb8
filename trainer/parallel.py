"""Data parallelism over ``torchrun`` ranks: DDP or FSDP2.

- DDP (the default with more than one rank): every rank holds the whole model, its
  gradients and AdamW state; gradients are all-reduced. Right when the model fits one GPU.
- FSDP2 (``fsdp=true``): ``torch.distributed.fsdp.fully_shard`` on every decoder layer and
  on the root, so parameters, gradients and optimizer state are split over the ranks
  (1/world each); a layer's parameters are all-gathered just before its forward and
  backward and freed after. With ``bf16-mixed`` on GPUs the gathered copies are bf16
  (reduce in fp32): half the traffic and memory of fp32 master weights.

Generation from a sharded model gathers it whole for the rollout (``gathered``) and
reshards afterwards: one all-gather per rollout instead of one per layer per decode step
(the sampler's decode steps are memory-bound and many; per-layer unsharding would put 28
all-gathers into every one of them). The gathered weights cost the bf16 model size per GPU
during the rollout (15 GB at 7B), freed before the training step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def wrap(policy: Any, *, fsdp: bool, world: int, device: torch.device, precision: str) -> Any:
    """What the training forward calls: the policy (sharded in place), DDP of it, or itself."""
    if fsdp:
        shard(policy, world, device, precision)
        return policy
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(policy, device_ids=ids)
    return policy


def shard(model: Any, world: int, device: torch.device, precision: str) -> None:
    """FSDP2 over all ranks: each decoder layer, then the root (embeddings, norm, head)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy()
    if precision == "bf16-mixed" and device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def is_sharded(model: Any) -> bool:
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gathered(model: Any) -> Iterator[None]:
    """Whole (unsharded) parameters on every rank for the duration; no-op when not sharded.

    Inside, the model's modules can be called directly (as the sampler's functional forward
    does) without FSDP hooks; every rank must enter and leave together (collectives)."""
    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not mods:
        yield
        return
    handles = [m.unshard(async_op=True) for m in mods]
    for h in handles:
        if h is not None:
            h.wait()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()


def grad_sync(model: Any, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """Reduce gradients over ranks in this backward (``enabled``) or only accumulate them
    locally (every micro-batch but the last).

    DDP only: FSDP2 reduce-scatters after every micro-batch, so the accumulated gradients
    stay sharded. Skipping its reduction would accumulate unsharded gradients instead, a
    whole model's worth per GPU (14 GiB of bf16 at 7B), which is what FSDP is there to avoid.
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm(model: Any, max_norm: float) -> float:
    """Clip the global gradient norm (over all ranks' shards when sharded); returns it."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
