"""A recipe of OpenAI graders through the TRL and verl adapters: a multi grader mixing
string_check, text_similarity and python (in the sandbox), called the way each framework
calls reward functions, its sub-graders' scores logged and returned as components of
their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.integrations.trl import ArbiterReward
from tests.arbiter.integrations.test_trl import assistant, trl_call, user
from tests.arbiter.integrations.test_verl import custom_reward_fn
from tests.conftest import start_service

MIXED = {
    "type": "multi",
    "name": "mixed",
    "graders": {
        "exact": {"type": "string_check", "name": "exact", "operation": "eq",
                  "input": "{{ sample.output_text }}", "reference": "{{ item.reference }}"},
        "fuzzy": {"type": "text_similarity", "name": "fuzzy", "evaluation_metric": "fuzzy_match",
                  "input": "{{ sample.output_text }}", "reference": "{{ item.reference }}"},
        "py": {"type": "python", "name": "py",
               "source": "def grade(sample, item):\n"
                         "    return float(item['reference'] in sample['output_text'])\n"},
    },
    "calculate_output": "(exact + fuzzy + py) / 3",
}  # fmt: skip
RECIPE = {"components": [{"name": "mixed", "weight": 1.0, "grader": MIXED}]}
PROMPTS = [user("Capital of France?")] * 2 + [user("Capital of Italy?")] * 2
COMPLETIONS = [assistant(c) for c in ("Paris", "It is Paris", "Rome", "Milan")]
ANSWER = ["Paris", "Paris", "Rome", "Rome"]
FUZZY = 10 / 16  # rapidfuzz ratio of "Paris" and "It is Paris": 2·5 / (5 + 11)
FUZZY_MILAN = 0.0  # "Rome", "Milan": no letter in common (case counts: m is not M)


@pytest.fixture(scope="module")
def gateway(
    log_dir: Path, verify_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Gateway -> verify, the sandbox; the recipe also named ``mixed`` (verl takes names)."""
    sandbox, sandbox_url = start_service(
        "sandbox", log_dir, {"SANDBOX_WORKERS": "2", "SANDBOX_NICE": "0"}
    )
    recipes = tmp_path_factory.mktemp("adapters") / "recipes.yaml"
    recipes.write_text(json.dumps({"recipes": [{"name": "mixed", **RECIPE}]}))
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url,
           "GATEWAY_SANDBOX_URL": sandbox_url, "GATEWAY_RECIPES_FILE": str(recipes)}  # fmt: skip
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()
    sandbox.stop()


def test_a_multi_grader_recipe_scores_through_trl_with_its_breakdown(gateway: str) -> None:
    total = ArbiterReward(recipe=RECIPE, base_url=gateway, reference_column="answer")
    values: Any = trl_call(total, PROMPTS, COMPLETIONS, answer=ANSWER)
    assert values == pytest.approx([1.0, (0 + FUZZY + 1) / 3, 1.0, (0 + FUZZY_MILAN + 0) / 3])
    metrics, extra = trl_call.metrics, trl_call.extra  # type: ignore[attr-defined]
    assert extra["arbiter/mixed/exact"] == [1.0, 0.0, 1.0, 0.0]
    assert extra["arbiter/mixed/py"] == [1.0, 1.0, 1.0, 0.0]
    assert metrics["arbiter/mixed/fuzzy/mean"] == pytest.approx([(2 + FUZZY + FUZZY_MILAN) / 4])
    # a sub-grader as a reward function of its own (TRL's reward_funcs, reward_weights)
    py = ArbiterReward("mixed/py", RECIPE, base_url=gateway, reference_column="answer")
    assert trl_call(py, PROMPTS, COMPLETIONS, answer=ANSWER) == [1.0, 1.0, 1.0, 0.0]


def test_a_named_grader_recipe_scores_through_verl_with_its_breakdown(gateway: str) -> None:
    fn = custom_reward_fn("compute_score", {"recipe": "mixed", "base_url": gateway,
                                            "window_ms": 0})  # fmt: skip
    got = fn(data_source="capitals", solution_str="It is Paris", ground_truth="Paris",
             extra_info={"index": 0})  # fmt: skip
    assert got["score"] == pytest.approx((0 + FUZZY + 1) / 3), got
    assert got["mixed/exact"] == 0.0 and got["mixed/py"] == 1.0, got
    assert got["mixed/fuzzy"] == pytest.approx(FUZZY), got
