"""verl's compute_score, loaded and called the way verl 0.9.1 does, against the real gateway.

verl itself imports ray and tensordict at package import, so its reward managers cannot run
here; the test loads the function with verl's own loader (verl/utils/import_utils.py, read
from the installed package without importing ``verl``) and calls it with the exact keyword
arguments of verl's managers:

- one sample, verl/experimental/reward_loop/reward_manager/naive.py ``run_single``: an
  async function is awaited, a sync one runs in ``loop.run_in_executor(None, …)``, and the
  reward loop gathers every sample of its chunk at once (reward_loop.py
  ``compute_score_batch``: ``asyncio.gather``);
- a batch, verl/workers/reward_manager/batch.py ``BatchRewardManager.verify``;
- either way wrapped by verl/trainer/ppo/reward.py ``_call_with_kwargs``, which merges
  ``reward.custom_reward_function.reward_kwargs`` over the call's own kwargs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from arbiter.client import ArbiterClient, NotConfigured
from arbiter.integrations import verl as arbiter_verl

Kw = dict[str, Any]


def _verl_loader() -> Any:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make setup installs it with --no-deps)")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "import_utils.py"
    loader_spec = importlib.util.spec_from_file_location("verl_import_utils", path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return module.load_extern_object


def custom_reward_fn(name: str, reward_kwargs: dict[str, Any]) -> Any:
    """verl's get_custom_reward_fn for ``path: pkg://arbiter.integrations.verl``."""
    raw_fn = _verl_loader()(module_path="pkg://arbiter.integrations.verl", object_name=name)

    def _call_with_kwargs(
        raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        return raw_fn(*args, **{**kwargs, **extra_kwargs})  # verl/trainer/ppo/reward.py

    async def _call_with_kwargs_async(
        raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        return await raw_fn(*args, **{**kwargs, **extra_kwargs})

    wrap = _call_with_kwargs_async if asyncio.iscoroutinefunction(raw_fn) else _call_with_kwargs
    return partial(wrap, raw_fn, reward_kwargs)


def gsm8k_rows(n_prompts: int = 2, g: int = 4) -> list[dict[str, Any]]:
    """verl's GSM8K rows (examples/data_preprocess/gsm8k.py): extra_info has split, index,
    answer, question; ground_truth is the number. Responses repeated per prompt (G = g)."""
    rows = []
    for i in range(n_prompts):
        a, b = 3 + i, 4 + i
        answers = [f"<think>{a}+{b}={a + b}</think><answer>{a + b}</answer>",
                   f"The answer is {a + b}.", f"<think>no idea</think><answer>{a * b}</answer>",
                   f"Let me add {a} and {b}: I get {a + b - 1}."]  # fmt: skip
        for j in range(g):
            rows.append({
                "data_source": "openai/gsm8k", "solution_str": answers[j % len(answers)],
                "ground_truth": str(a + b),
                "extra_info": {"split": "train", "index": i, "answer": f"#### {a + b}",
                               "question": f"What is {a} + {b}?"},
            })  # fmt: skip
    return rows


def whole_groups(url: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The direct client's scores of the same groups, flattened back to rows."""
    by_index: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_index.setdefault(row["extra_info"]["index"], []).append(row)
    groups = [{"prompt": rs[0]["extra_info"]["question"], "reference": rs[0]["ground_truth"],
               "responses": [r["solution_str"] for r in rs]}
              for rs in by_index.values()]  # fmt: skip
    out = ArbiterClient(url).score(groups, "gsm8k-diverse")
    flat = []
    for g in out.groups:
        for j, total in enumerate(g.rewards):
            flat.append({"score": total, **{k: v[j] for k, v in g.components.items()}})
    return flat


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["arbiter_masked"] == 0.0
        for key, value in w.items():
            assert g[key] == pytest.approx(value, abs=1e-5), key


def test_batch_signature_groups_by_index(diverse_gateway_url: str) -> None:
    fn = custom_reward_fn(
        "compute_score", {"recipe": "gsm8k-diverse", "base_url": diverse_gateway_url}
    )
    rows = gsm8k_rows()
    extras = [dict(r["extra_info"], rollout_reward_scores={}) for r in rows]  # batch.py adds it
    got = fn(data_sources=[r["data_source"] for r in rows],
             solution_strs=[r["solution_str"] for r in rows],
             ground_truths=[r["ground_truth"] for r in rows], extra_infos=extras)  # fmt: skip
    assert_same(got, whole_groups(diverse_gateway_url, rows))
    assert set(got[0]) == {"score", "math_accuracy", "format", "diversity", "arbiter_masked"}


async def _reward_loop(fn: Any, rows: list[dict[str, Any]], is_async: bool) -> list[Any]:
    """naive.py run_single for every sample of a chunk at once (reward_loop.py gather)."""
    loop = asyncio.get_running_loop()
    # A sync function runs on the loop's default executor: min(32, CPUs + 4) threads, 6 on
    # this 2-core machine. Only calls in flight together can share a window, so give it a
    # thread per sample here; with fewer, a group is split (docs: prefer the async one).
    loop.set_default_executor(ThreadPoolExecutor(max_workers=len(rows)))

    async def run_single(row: dict[str, Any]) -> Any:
        extra_info = dict(row["extra_info"], num_turns=None, rollout_reward_scores={})
        kwargs = {"data_source": row["data_source"], "solution_str": row["solution_str"],
                  "ground_truth": row["ground_truth"], "extra_info": extra_info}  # fmt: skip
        if is_async:
            return await fn(**kwargs)
        return await loop.run_in_executor(None, lambda: fn(**kwargs))

    return list(await asyncio.gather(*(run_single(r) for r in rows)))


@pytest.mark.parametrize("name", ["compute_score_async", "compute_score"])
def test_single_samples_arriving_together_are_scored_as_groups(
    diverse_gateway_url: str, name: str
) -> None:
    fn = custom_reward_fn(name, {"recipe": "gsm8k-diverse", "base_url": diverse_gateway_url})
    rows = gsm8k_rows()
    got = asyncio.run(_reward_loop(fn, rows, is_async=name.endswith("async")))
    # diversity of a lone sample would be null (group_too_small): equal to the whole group's
    # scores means the window put the four samples of each prompt together
    assert_same(got, whole_groups(diverse_gateway_url, rows))


def test_masked_total_becomes_the_fill_value_and_is_flagged(gateway_url: str) -> None:
    fn = custom_reward_fn("compute_score", {"recipe": "gsm8k", "base_url": gateway_url,
                                            "masked_score": -1.0})  # fmt: skip
    got = fn(data_source="openai/gsm8k", solution_str="<think>x</think><answer>7</answer>",
             ground_truth="banana", extra_info={"index": 0})  # fmt: skip
    # "banana" is no math value: math_accuracy null, so the total is masked
    assert got["score"] == -1.0 and got["arbiter_masked"] == 1.0
    assert math.isnan(got["math_accuracy"]) and got["format"] == 1.0


def test_sample_without_group_key_is_scored_alone(
    diverse_gateway_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arbiter_verl, "_warned_kinds", set())
    fn = custom_reward_fn("compute_score", {"recipe": "gsm8k-diverse", "window_ms": 0,
                                            "base_url": diverse_gateway_url})  # fmt: skip
    with caplog.at_level(logging.WARNING, "arbiter.integrations.verl"):
        got = fn(data_source="x", solution_str="<think>1+1=2</think><answer>2</answer>",
                 ground_truth="2", extra_info=None)  # fmt: skip
    assert got["math_accuracy"] == 1.0 and math.isnan(got["diversity"])  # a group of one
    assert got["arbiter_masked"] == 1.0  # diversity is weighted, so the total is masked
    assert got["score"] == 0.0  # verl needs a number: masked_score, flagged
    # the warning says why: the kind, the component's reason, and what to do about it
    (warning,) = [r.getMessage() for r in caplog.records if r.name == arbiter_verl.log.name]
    assert "kind 'group_too_small'" in warning and "diversity: diversity needs" in warning
    assert "same extra_info key" in warning and "score=0.0 with arbiter_masked=1" in warning


@pytest.mark.parametrize("recipe", ["gsm8k-dj", "gsm8k-verifier"])
@pytest.mark.parametrize("name", ["compute_score_async", "compute_score"])
def test_a_judge_recipe_without_a_judge_stops_at_once(
    gateway_url: str, recipe: str, name: str
) -> None:
    """The session gateway has no judge: the first call raises the refusal, for one sample
    and for a batch; nothing is filled in with masked_score."""
    fn = custom_reward_fn(name, {"recipe": recipe, "base_url": gateway_url})
    rows = gsm8k_rows(1, 2)
    with pytest.raises(NotConfigured, match="GATEWAY_JUDGE_URL") as info:
        asyncio.run(_reward_loop(fn, rows, is_async=name.endswith("async")))
    assert not info.value.retryable and "--judge-base-url URL" in info.value.message
    batch = {"data_sources": [r["data_source"] for r in rows],
             "solution_strs": [r["solution_str"] for r in rows],
             "ground_truths": [r["ground_truth"] for r in rows],
             "extra_infos": [r["extra_info"] for r in rows]}  # fmt: skip
    with pytest.raises(NotConfigured, match=recipe):
        out = fn(**batch)
        if asyncio.iscoroutine(out):
            asyncio.run(out)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # no recipe in reward_kwargs nor ARBITER_RECIPE
        ({"solution_str": "x"}, "reward_kwargs.recipe"),
        # batch lists of different lengths
        ({"recipe": "gsm8k", "solution_strs": ["a", "b"], "ground_truths": ["1"]},
         r"solution_strs \(2\), ground_truths \(1\)"),
    ],
)  # fmt: skip
def test_bad_calls_say_what_is_wrong(
    gateway_url: str, kwargs: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARBITER_RECIPE", raising=False)
    fn = custom_reward_fn("compute_score", {"base_url": gateway_url})
    with pytest.raises(ValueError, match=message):
        fn(**kwargs)


def test_recipe_and_url_from_the_environment(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARBITER_RECIPE", "gsm8k")
    monkeypatch.setenv("ARBITER_URL", gateway_url)
    fn = custom_reward_fn("compute_score", {})
    got = fn(data_source="openai/gsm8k", solution_str="<think>9+9</think><answer>18</answer>",
             ground_truth="18", extra_info={"index": 3})  # fmt: skip
    assert got == {"score": 1.5, "math_accuracy": 1.0, "format": 1.0, "arbiter_masked": 0.0}
