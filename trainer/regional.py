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

_COMPILED: dict[Callable[..., Any], Callable[..., Any]] = {}


@contextlib.contextmanager
def layers_swapped(
    layers: Any, plain: Callable[..., Any], checkpointed: Callable[..., Any], compile: bool
) -> Iterator[None]:
    """Each layer's forward is ``plain(layer, ...)``, or ``checkpointed(layer, ...)`` for a
    layer set to gradient checkpointing, for the duration of the block; torch.compile'd once
    per function when ``compile``."""
    ckpt = [bool(getattr(layer, "gradient_checkpointing", False)) for layer in layers]
    for layer, c in zip(layers, ckpt, strict=True):
        fn = checkpointed if c else plain
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
