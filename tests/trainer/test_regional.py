"""A decoder layer whose compilation fails runs eagerly: one warning, the same values, the run
goes on."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from arbiter.trainer import regional
from arbiter.trainer.logprobs import completion_logprobs
from arbiter.trainer.setup import load_model

from .test_prefix import _batch


def _broken_backend(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("injected compile failure")


@pytest.mark.parametrize("shared", [True, False])
def test_a_layer_that_fails_to_compile_runs_eagerly_with_one_warning(
    tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    shared: bool,
) -> None:
    # A stand-in for an Inductor error on some model or shape (the shared-prefix layer's
    # dynamic shapes once failed so on a GPU, which the CPU cannot reproduce): a torch.compile
    # backend that raises -- the one fault injected here; everything else is the real path.
    torch.set_num_threads(1)
    torch._dynamo.reset()
    monkeypatch.setattr(regional, "_COMPILED", {})
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=_broken_backend))
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    model.train()
    ids, attn = _batch(groups=2, g=3, p=8, n=5, pad=3, eos_at=2)

    def run(compile: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        lp, _ = completion_logprobs(model, ids, attn, 5, chunk_tokens=7, compile=compile,
                                    shared_prefix=shared)  # fmt: skip
        lp.sum().backward()
        return lp.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    want, want_grads = run(False)
    with caplog.at_level(logging.WARNING, logger="arbiter.trainer"):
        for _ in range(3):  # three steps, every layer each: still one warning per function
            got, grads = run(True)
            torch.testing.assert_close(got, want)
            for k, g in want_grads.items():
                torch.testing.assert_close(grads[k], g, msg=k)
    warned = [r.getMessage() for r in caplog.records if "torch.compile of" in r.getMessage()]
    layer = [m for m in warned if "_layer" in m]
    assert len(layer) == 1 and "injected compile failure" in layer[0]
    assert len(warned) == len(set(m.split(" failed")[0] for m in warned))  # one per function
    assert all(isinstance(f, regional._OrEager) and f.failed for f in regional._COMPILED.values())
