"""Model setup: gradient checkpointing with some decoder layers keeping their activations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbiter.trainer.setup import kept_layers, load_model


@pytest.mark.parametrize(
    ("n", "keep", "expected"),
    [(28, 2, [0, 14]), (28, 4, [0, 7, 14, 21]), (28, 0, []), (2, 5, [0, 1]), (3, 1, [0])],
)
def test_kept_layers_are_spread_evenly(n: int, keep: int, expected: list[int]) -> None:
    assert kept_layers(n, keep) == expected


def test_kept_layers_run_once_and_the_gradients_do_not_change(tiny_model: Path) -> None:
    """With checkpointing, a recomputed layer runs twice per forward + backward; a kept one
    once (counted at its MLP: the recompute calls the layer's forward, not its hooks). The
    gradients are those of the model without checkpointing."""
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (2, 12))

    def run(**kw: object) -> tuple[list[int], dict[str, torch.Tensor]]:
        model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True, **kw)  # type: ignore[arg-type]
        calls = [0] * len(model.model.layers)
        for i, layer in enumerate(model.model.layers):
            layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).sum().backward()
        return calls, {k: p.grad for k, p in model.named_parameters() if p.grad is not None}

    plain_calls, plain = run()
    all_calls, _ = run(gradient_checkpointing=True)
    kept_calls, kept = run(gradient_checkpointing=True, keep_layers=1)
    assert plain_calls == [1, 1] and all_calls == [2, 2]
    assert kept_calls == [1, 2]  # layer 0 kept its activations, layer 1 was recomputed
    assert kept.keys() == plain.keys()
    for k in plain:
        torch.testing.assert_close(kept[k], plain[k], msg=k)


def test_keeping_layers_needs_a_decoder_with_layers() -> None:
    """Models without ``model.layers`` (GPT-2 keeps ``transformer.h``) still checkpoint with
    keep_layers=0; asking to keep some layers says which setting to change."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from arbiter.trainer.setup import enable_gradient_checkpointing

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
    enable_gradient_checkpointing(model)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    with pytest.raises(ValueError, match="gradient_checkpointing_keep_layers=1"):
        enable_gradient_checkpointing(model, 1)
