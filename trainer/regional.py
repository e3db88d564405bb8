"""Regional compilation of a decoder's layers: each layer's forward swapped for one call.

Every layer runs the same function with the layer as its first argument, so one
``torch.compile`` serves all of them. A layer set to gradient checkpointing runs the
checkpointed function instead, with its own (Hugging Face) checkpointing off meanwhile: a
compiled forward under an eager checkpoint would be recomputed eagerly, with other saved
tensors than the forward's. Used by the plain training forward (``trainer.logprobs``) and the
shared-prefix one (``trainer.prefix``); the swap lasts one call, inside the model's own
forward, so DDP's and FSDP2's hooks see an ordinary forward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

_COMPILED: dict[Callable[..., Any], Callable[..., Any]] = {}


_CHECKPOINTED: dict[Callable[..., Any], Callable[..., Any]] = {}


def checkpointed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(layer, ...)`` recomputed in backward (non-reentrant checkpoint) when the layer
    trains with grad enabled; one wrapper per ``fn``, so its compilation is cached too."""
    if fn not in _CHECKPOINTED:

        def run(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if not (layer.training and torch.is_grad_enabled()):
                return fn(layer, *args, **kwargs)
            return checkpoint(functools.partial(fn, layer, **kwargs), *args, use_reentrant=False)

        _CHECKPOINTED[fn] = run
    return _CHECKPOINTED[fn]


@contextlib.contextmanager
def layers_swapped(layers: Any, plain: Callable[..., Any], compile: bool) -> Iterator[None]:
    """Each layer's forward is ``plain(layer, ...)``, checkpointed (``checkpointed``) for a
    layer set to gradient checkpointing, for the duration of the block; torch.compile'd once
    per function when ``compile``."""
    ckpt = [bool(getattr(layer, "gradient_checkpointing", False)) for layer in layers]
    for layer, c in zip(layers, ckpt, strict=True):
        fn = checkpointed(plain) if c else plain
        if compile:
            if fn not in _COMPILED:
                _COMPILED[fn] = torch.compile(fn)
            fn = _COMPILED[fn]
        layer.forward = functools.partial(fn, layer)
        if c:
            layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer, c in zip(layers, ckpt, strict=True):
            del layer.forward
            if c:
                layer.gradient_checkpointing = True
