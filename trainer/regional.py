"""Regional compilation of a decoder's layers: each layer's forward swapped for one call.

Every layer runs the same function with the layer as its first argument, so one
``torch.compile`` serves all of them. A layer set to gradient checkpointing runs the
checkpointed function instead, with its own (Hugging Face) checkpointing off meanwhile: a
compiled forward under an eager checkpoint would be recomputed eagerly, with other saved
tensors than the forward's. Used by the plain training forward (``trainer.logprobs``) and the
shared-prefix one (``trainer.prefix``); the swap lasts one call, inside the model's own
forward, so DDP's and FSDP2's hooks see an ordinary forward.

A compiled function that fails to compile (an Inductor or Dynamo error on some model or
shape) falls back to the eager function for the rest of the process, with one warning: the
run goes on at eager speed instead of stopping. Its backward is compiled together with its
forward (not lazily at the first backward), so a failure there falls back too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._functorch.config
from torch.utils.checkpoint import checkpoint

log = logging.getLogger("arbiter.trainer")

_COMPILED: dict[Callable[..., Any], Callable[..., Any]] = {}


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn)``, once per ``fn``, that runs ``fn`` eagerly from its first
    compile failure on (one warning)."""
    if fn not in _COMPILED:
        _COMPILED[fn] = _OrEager(fn, torch.compile(fn))
    return _COMPILED[fn]


class _OrEager:
    """The compiled function until it fails to compile, then the eager one."""

    def __init__(self, eager: Callable[..., Any], compiled: Callable[..., Any]) -> None:
        self.eager, self.compiled, self.failed = eager, compiled, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed:
            return self.eager(*args, **kwargs)
        try:
            with _backward_compiled_with_forward():
                return self.compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:  # Dynamo's, AOTAutograd's, Inductor's
            self.failed = True
            name = getattr(self.eager, "__qualname__", repr(self.eager))
            lines = [x.strip() for x in str(e).splitlines() if x.strip()] or [""]
            first = " ".join(lines[:2] if lines[0].endswith(":") else lines[:1])[:300]
            log.warning(
                "torch.compile of %s failed (%s: %s); running it eagerly from now on "
                "(set compile_train=false to skip compiling)",
                name, type(e).__name__, first,
            )  # fmt: skip
            return self.eager(*args, **kwargs)


def _backward_compiled_with_forward() -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd compiles the backward at the forward's compilation (else a backward that
    fails to compile would fail in ``loss.backward()``, outside the fallback)."""
    config = torch._functorch.config
    if hasattr(config, "force_non_lazy_backward_lowering"):
        return config.patch(force_non_lazy_backward_lowering=True)
    return contextlib.nullcontext()


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
    per function when ``compile`` (``compiled``: eager after a compile failure)."""
    ckpt = [bool(getattr(layer, "gradient_checkpointing", False)) for layer in layers]
    for layer, c in zip(layers, ckpt, strict=True):
        fn = checkpointed(plain) if c else plain
        if compile:
            fn = compiled(fn)
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
