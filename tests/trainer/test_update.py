"""The training step's shortcuts change nothing: trimming each micro-batch's padding gives
the same log-probs, losses and gradients as the padded batch, and the compiled training
forward (regional torch.compile; here with a CPU backend) gives the eager one's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from arbiter.trainer import regional
from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.grpo import build_optimizer
from arbiter.trainer.logprobs import completion_logprobs, trim_padding
from arbiter.trainer.rollout import Rollout
from arbiter.trainer.setup import Dist, enable_gradient_checkpointing, load_model
from arbiter.trainer.update import train_on_batch

Env = Literal["none", "calculator", "calculator-off"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _batch(S: int = 4, P: int = 9, N: int = 7) -> Rollout:
    """Left-padded prompts (every row has >= 2 padding columns) and right-padded
    completions (no row uses the last 2 columns), one row with an unattended gap."""
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (S, P + N))
    attn = torch.ones_like(ids)
    loss = torch.ones(S, N, dtype=torch.long)
    for i, (pad, used) in enumerate([(2, 5), (4, 3), (3, 4), (2, 1)]):
        attn[i, :pad] = 0
        attn[i, P + used :] = 0
        loss[i, used:] = 0
        ids[i, :pad] = 0
    return Rollout(problems=[], prompts=[], texts=[""] * S, input_ids=ids,
                   attention_mask=attn, loss_mask=loss)  # fmt: skip


def test_trim_padding_drops_only_unneeded_columns() -> None:
    roll = _batch()
    ids, _, n = trim_padding(roll.input_ids, roll.attention_mask, roll.loss_mask)
    assert n == 5  # the longest row's actions
    assert ids.shape == (4, 9 - 2 + 5)  # two shared padding columns dropped on the left
    assert torch.equal(ids, roll.input_ids[:, 2 : 9 + 5])
    # no loss token at all: one completion column is kept
    _, _, n0 = trim_padding(roll.input_ids, roll.attention_mask, torch.zeros_like(roll.loss_mask))
    assert n0 == 1


def test_trimmed_logprobs_equal_the_padded_ones(tiny_model: Path) -> None:
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    roll = _batch()
    N = roll.n_completion
    full, _ = completion_logprobs(model, roll.input_ids, roll.attention_mask, N, chunk_tokens=5)
    ids, attn, n = trim_padding(roll.input_ids, roll.attention_mask, roll.loss_mask)
    got, _ = completion_logprobs(model, ids, attn, n, chunk_tokens=5)
    keep = roll.loss_mask.bool()
    torch.testing.assert_close(got[keep[:, :n]], full[keep])


def _step(tiny_model: Path, ckpt: bool, **kw: Any) -> tuple[dict[str, float], dict[str, Any]]:
    cfg = TrainerConfig(model=str(tiny_model), rollouts_per_step=4, group_size=2, lr=1e-3,
                        micro_batch_size=2, logprob_chunk_tokens=4)  # fmt: skip
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    if ckpt:
        enable_gradient_checkpointing(model)
    opt, _ = build_optimizer(model, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    if kw.pop("compile", False):
        with _compile_on_cpu():
            stats = train_on_batch(cfg, model, opt, _batch(), adv, Dist(), "fp32", **kw)
    else:
        stats = train_on_batch(cfg, model, opt, _batch(), adv, Dist(), "fp32", **kw)
    return stats, {k: p.detach().clone() for k, p in model.named_parameters()}


def test_trimmed_step_equals_the_padded_step(tiny_model: Path) -> None:
    s_pad, w_pad = _step(tiny_model, False, trim=False)
    s_trim, w_trim = _step(tiny_model, False)
    for k in s_pad:
        assert s_trim[k] == pytest.approx(s_pad[k], rel=1e-5, abs=1e-7), k
    for k in w_pad:
        torch.testing.assert_close(w_trim[k], w_pad[k], msg=k)


class _compile_on_cpu:
    """Make the trainer's compiled path run on the CPU: ``train_compiled`` says yes and
    ``torch.compile`` uses the aot_eager backend (traced and partitioned like inductor's
    input, without generating code)."""

    def __enter__(self) -> None:
        self.mp = pytest.MonkeyPatch()
        real = torch.compile
        self.mp.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="aot_eager"))
        self.mp.setattr("arbiter.trainer.update.train_compiled", lambda *a: True)
        self.mp.setattr(regional, "_COMPILED", {})

    def __exit__(self, *exc: object) -> None:
        self.mp.undo()


def test_compiled_step_equals_the_eager_step(tiny_model: Path) -> None:
    from torch._dynamo.utils import counters

    s_eager, w_eager = _step(tiny_model, True)
    graphs = counters["stats"]["unique_graphs"]
    s_comp, w_comp = _step(tiny_model, True, compile=True)
    assert counters["stats"]["unique_graphs"] > graphs  # it did compile
    for k in s_eager:
        assert s_comp[k] == pytest.approx(s_eager[k], rel=1e-5, abs=1e-7), k
    for k in w_eager:
        torch.testing.assert_close(w_comp[k], w_eager[k], msg=k)


@pytest.mark.parametrize(
    ("env", "compiled"),
    [
        ("none", True),  # single-turn on a GPU: compiled, the default
        ("calculator-off", True),  # the tool's prompt, one turn: still single-turn
        ("calculator", False),  # multi-turn: the compiled backward fails there, so eager
    ],
)
def test_multi_turn_trains_eagerly_with_one_warning(env: Env, compiled: bool) -> None:
    from arbiter.trainer.update import multi_turn_eager, train_compiled

    cfg = TrainerConfig(model="unused", env=env, compile_train=True)
    gpu, model = torch.device("cuda"), torch.nn.Linear(2, 2)
    assert train_compiled(cfg, model, gpu) is compiled
    warning = multi_turn_eager(cfg, gpu)
    assert (warning is None) is compiled
    if warning:
        assert "env=calculator" in warning and "eagerly" in warning
    # compile_train=false, or the CPU: nothing is overridden, nothing to say
    assert (
        multi_turn_eager(TrainerConfig(model="unused", env=env, compile_train=False), gpu) is None
    )
    assert multi_turn_eager(cfg, torch.device("cpu")) is None
