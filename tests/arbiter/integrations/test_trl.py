"""TRL reward functions, called the way TRL 1.16 calls them, against the real gateway.

TRL's call (trl/trainer/grpo_trainer.py, ``GRPOTrainer._calculate_rewards``): sync
functions get ``f(prompts=, completions=, completion_ids=, **columns, trainer_state=,
log_extra=, log_metric=)``; async ones the same, awaited on TRL's own event loop thread
(``asyncio.run_coroutine_threadsafe(…, self.async_loop)``). The last tests run TRL's real
``GRPOTrainer`` for two steps on the tiny model, in one process and in two (torchrun, gloo).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from arbiter.client import ArbiterClient, RetryPolicy
from arbiter.errors import ArbiterError, NotConfigured
from arbiter.integrations import trl as arbiter_trl
from arbiter.integrations.trl import ArbiterReward, AsyncArbiterReward, recipe_rewards
from arbiter.procs import free_port
from tests.arbiter.integrations.conftest import score_requests

trl_utils = pytest.importorskip("trl.trainer.utils")  # the `test` extra installs trl

GOOD = "<think>9 + 9 = 18</think><answer>18</answer>"
WRONG = "<think>guess</think><answer>17</answer>"
BARE = "The answer is 18."
RUN = Path(__file__).with_name("grpo_run.py")


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


def trl_call(func: Any, prompts: list[Any], completions: list[Any], **columns: Any) -> Any:
    """Call ``func`` with exactly the keyword arguments TRL passes (and record its logs)."""
    metrics: dict[str, list[float]] = defaultdict(list)
    extra: dict[str, list[Any]] = defaultdict(list)
    out = func(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1, 2, 3]] * len(prompts),
        **columns,
        trainer_state=object(),
        log_extra=lambda column, values: extra[column].extend(values),
        log_metric=lambda name, value: metrics[name].append(value),
    )
    trl_call.metrics, trl_call.extra = metrics, extra  # type: ignore[attr-defined]
    return out


# TRL's batch: each prompt repeated num_generations (2) times in a row.
PROMPTS = [user("9+9?")] * 2 + [user("2+2?")] * 2
COMPLETIONS = [assistant(c) for c in (GOOD, WRONG, BARE, "4")]
ANSWER = ["18", "18", "#### 4", "#### 4"]


def test_component_functions_share_one_gateway_call(gateway_url: str) -> None:
    funcs = [ArbiterReward(c, "gsm8k", base_url=gateway_url) for c in ("math_accuracy", "format")]
    total = ArbiterReward(recipe="gsm8k", base_url=gateway_url)
    before = score_requests(gateway_url)
    values = [trl_call(f, PROMPTS, COMPLETIONS, answer=ANSWER) for f in (*funcs, total)]
    assert values == [
        [1.0, 0.0, 0.0, 1.0],  # math_accuracy (BARE says 18 for 2+2)
        [1.0, 1.0, 0.0, 0.0],  # format
        [1.5, 0.5, 0.0, 1.0],  # gsm8k = 1.0·math + 0.5·format
    ]
    assert score_requests(gateway_url) - before == 1  # one batch, one request
    # TRL names each function's metrics after __name__ (trl.trainer.utils.get_callable_name).
    names = [trl_utils.get_callable_name(f) for f in (*funcs, total)]
    assert names == ["math_accuracy", "format", "arbiter_gsm8k"]


def test_recipe_rewards_gives_functions_and_weights(gateway_url: str) -> None:
    funcs, weights = recipe_rewards("gsm8k", base_url=gateway_url)
    assert [f.__name__ for f in funcs] == ["math_accuracy", "format"] and weights == [1.0, 0.5]
    with pytest.raises(ValueError, match=r"'nope' is not on the gateway; it has .*'gsm8k'"):
        recipe_rewards("nope", base_url=gateway_url)


def test_total_logs_each_component_through_log_metric(gateway_url: str) -> None:
    total = ArbiterReward(recipe="gsm8k", base_url=gateway_url)
    trl_call(total, PROMPTS, COMPLETIONS, answer=ANSWER)
    metrics, extra = trl_call.metrics, trl_call.extra  # type: ignore[attr-defined]
    assert dict(metrics) == {"arbiter/math_accuracy/mean": [0.5], "arbiter/format/mean": [0.5],
                             "arbiter/masked_frac": [0.0]}  # fmt: skip
    assert extra["arbiter/format"] == [1.0, 1.0, 0.0, 0.0]  # per completion, for the table


def test_chat_scores_the_last_assistant_message_as_text(gateway_url: str) -> None:
    total = ArbiterReward(recipe="gsm8k", base_url=gateway_url)
    parts = [{"type": "text", "text": "<think>9 + 9 = 18</think>"},
             {"type": "text", "text": "<answer>18</answer>"}]  # fmt: skip
    completions = [
        # a tool result after the answer is not the model's answer
        [{"role": "assistant", "content": GOOD}, {"role": "tool", "content": "17"}],
        # list-of-parts content is scored as its joined text, not its Python repr
        [{"role": "assistant", "content": parts}],
    ]
    assert trl_call(total, [user("9+9?")] * 2, completions, answer=["18"] * 2) == [1.5, 1.5]
    with pytest.raises(ValueError, match="no 'assistant' message"):
        trl_call(total, [user("9+9?")], [[{"role": "tool", "content": "18"}]], answer=["18"])


def test_wrong_reference_column_names_it(gateway_url: str) -> None:
    reward = ArbiterReward(recipe="gsm8k", base_url=gateway_url, reference_column="solution")
    with pytest.raises(KeyError, match=r"'solution' is not a column.*TRL passed \['answer'\]"):
        trl_call(reward, PROMPTS, COMPLETIONS, answer=ANSWER)


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        # a component the named recipe does not have
        (ArbiterReward("diversity", "gsm8k"), r"'diversity' is not in recipe 'gsm8k'"),
        # the total of no recipe at all
        (ArbiterReward(), "no recipe; pass recipe="),
    ],
)
def test_misconfigured_functions_say_how_to_fix(
    gateway_url: str, reward: ArbiterReward, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARBITER_RECIPE", raising=False)
    reward.base_url = gateway_url
    with pytest.raises(ValueError, match=message):
        trl_call(reward, PROMPTS, COMPLETIONS, answer=ANSWER)


def test_component_without_recipe_scores_it_alone(gateway_url: str) -> None:
    reward = ArbiterReward("format", base_url=gateway_url, reference_column=None)
    assert trl_call(reward, PROMPTS, COMPLETIONS) == [1.0, 1.0, 0.0, 0.0]


def test_importable_by_name_and_picklable(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARBITER_URL", gateway_url)
    monkeypatch.setenv("ARBITER_RECIPE", "gsm8k")
    monkeypatch.setenv("ARBITER_REFERENCE_COLUMN", "answer")
    # How `trl grpo --reward_funcs a.b.name` resolves a name (trl/scripts/grpo.py, main()).
    module_path, func_name = ["arbiter.integrations.trl", "math_accuracy"]
    func = getattr(importlib.import_module(module_path), func_name)
    copy = pickle.loads(pickle.dumps(func))  # TRL's async GRPO pickles reward functions
    assert trl_call(copy, PROMPTS, COMPLETIONS, answer=ANSWER) == [1.0, 0.0, 0.0, 1.0]
    assert trl_utils.get_callable_name(arbiter_trl.total) == "arbiter_gsm8k"


def test_async_variant_on_trls_event_loop_thread(gateway_url: str) -> None:
    reward = AsyncArbiterReward(recipe="gsm8k", base_url=gateway_url)
    assert trl_utils.is_async_callable(reward)  # TRL's own test for "await it"
    loop = asyncio.new_event_loop()  # as GRPOTrainer.async_loop: a loop in its own thread
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        for _ in range(2):  # the same function, reused across steps
            batch = trl_call(reward, PROMPTS, COMPLETIONS, answer=ANSWER)
            assert asyncio.run_coroutine_threadsafe(batch, loop).result(60) == [1.5, 0.5, 0.0, 1.0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_masked_score_is_none_with_a_one_time_nansum_warning(
    gateway_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arbiter_trl, "_warned_kinds", set())
    reward = ArbiterReward(recipe="gsm8k", base_url=gateway_url)
    with caplog.at_level(logging.WARNING, "arbiter.integrations.trl"):
        for _ in range(2):
            # "banana" is no math value: math_accuracy is null, so the total is None
            assert trl_call(reward, [user("9+9?")], [assistant(GOOD)],
                            answer=["banana"]) == [None]  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if "nansum" in r.getMessage()]
    assert len(warnings) == 1 and "counts this None as 0" in warnings[0]
    # the kind and the first reason, not just a count
    assert "kind 'invalid_reference'" in warnings[0] and "math_accuracy: " in warnings[0]


@pytest.mark.parametrize("recipe", ["gsm8k-dj", "gsm8k-verifier"])
def test_a_judge_recipe_without_a_judge_stops_at_once(
    gateway_url: str, recipe: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The session gateway has no judge: the first call is refused (no retries), and
    recipe_rewards refuses when it asks for the recipe."""
    before = score_requests(gateway_url)
    for func in (ArbiterReward(recipe=recipe, base_url=gateway_url),
                 AsyncArbiterReward(recipe=recipe, base_url=gateway_url)):  # fmt: skip
        with (
            caplog.at_level(logging.WARNING, "arbiter.client"),
            pytest.raises(NotConfigured, match="--judge-base-url URL") as info,
        ):
            out = trl_call(func, PROMPTS, COMPLETIONS, answer=ANSWER)
            if asyncio.iscoroutine(out):
                asyncio.run(out)
        assert not info.value.retryable and info.value.code == "component_not_configured"
        assert "retry" not in caplog.text  # refused once, never retried
    with pytest.raises(NotConfigured, match="GATEWAY_JUDGE_URL"):
        recipe_rewards(recipe, base_url=gateway_url)
    assert score_requests(gateway_url) == before  # nothing was scored


def test_retries_a_gateway_that_is_not_there_yet() -> None:
    client = ArbiterClient(f"http://127.0.0.1:{free_port()}",
                           retry=RetryPolicy(attempts=2, base_delay=0.01))  # fmt: skip
    reward = ArbiterReward(recipe="gsm8k", client=client)
    with pytest.raises(ArbiterError, match="not reached after 2 tries") as info:
        trl_call(reward, PROMPTS, COMPLETIONS, answer=ANSWER)
    assert info.value.retryable  # an ArbiterError, not a raw httpx.ConnectError


# -- TRL's real GRPOTrainer ---------------------------------------------------------------
def grpo(url: str, model: Path, out: Path, recipe: str, component: str, nproc: int) -> Any:
    launcher = [sys.executable, str(RUN)]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                    "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                    str(RUN)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(RUN.parents[3])}
    done = subprocess.run([*launcher, url, str(model), str(out), recipe, component],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "log.json").read_text())


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, gsm8k_dir: Path) -> Path:
    from arbiter.tiny_model import build

    return build(tmp_path_factory.mktemp("tiny-model") / "model", gsm8k_dir)


def test_grpo_trainer_logs_every_component(
    gateway_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    log = grpo(gateway_url, tiny_model, tmp_path, "gsm8k", "math_accuracy", nproc=1)
    steps = [h for h in log if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        # the per-function metrics TRL logs, and the total's per-component ones (log_metric)
        for key in (
            "rewards/math_accuracy/mean",
            "rewards/arbiter_gsm8k/mean",
            "arbiter/math_accuracy/mean",
            "arbiter/format/mean",
            "arbiter/masked_frac",
        ):
            assert key in h, (key, sorted(h))  # fmt: skip
        assert h["arbiter/math_accuracy/mean"] == h["rewards/math_accuracy/mean"]


def test_grpo_trainer_on_two_ranks_scores_whole_groups(
    diverse_gateway_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    log = grpo(diverse_gateway_url, tiny_model, tmp_path, "gsm8k-diverse", "diversity", nproc=2)
    assert "arbiter/diversity/mean" in log[0]
    ranks = [[json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").open()] for r in (0, 1)]
    client = ArbiterClient(diverse_gateway_url)
    for a, b in zip(*ranks, strict=True):  # one step: each rank holds half of the one group
        assert len(a["values"]) == len(b["values"]) == 2 and a["prompts"] == b["prompts"]
        texts = [c[-1]["content"] for c in a["completions"] + b["completions"]]
        group = {"prompt": a["prompts"][0][-1]["content"], "reference": a["answer"][0],
                 "responses": texts}  # fmt: skip
        whole = client.score([group], "gsm8k-diverse").groups[0].components["diversity"]
        assert a["values"] + b["values"] == pytest.approx(whole, abs=1e-5)
        # A half-group of two gives both members the same diversity: no signal. Whole
        # groups of four give each its own.
        assert a["values"][0] != pytest.approx(a["values"][1], abs=1e-6)


def test_the_adapters_log_the_gateway_they_use(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from arbiter.integrations import verl

    monkeypatch.setenv("ARBITER_URL", "http://127.0.0.1:28000")
    kept = verl._CLIENTS.pop((None, None), None)  # the module keeps clients by (url, key)
    with caplog.at_level(logging.INFO, logger="arbiter.integrations"):
        assert ArbiterReward(component="format").client.base_url == "http://127.0.0.1:28000"
        verl.Settings.from_kwargs({"recipe": "gsm8k"}).client()
    verl._CLIENTS.pop((None, None), None)  # not this test's client for the tests after it
    if kept is not None:
        verl._CLIENTS[(None, None)] = kept
    said = [r.getMessage() for r in caplog.records]
    assert "format: rewards from the gateway at http://127.0.0.1:28000" in said, said
    assert "verl rewards from the gateway at http://127.0.0.1:28000" in said, said
