"""OpenAI graders through the gateway: the official ``openai`` package's
``fine_tuning.alpha.graders.run``/``validate`` pointed at it, and grader components in a
``/v1/score`` recipe. Real processes: Redis, verify, the sandbox (python graders), the
gateway. The examples are the OpenAI graders guide's, with its expected results."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from rapidfuzz import fuzz

from tests.conftest import start_service

FUZZY_SOURCE = """\
from rapidfuzz import fuzz, utils

def grade(sample, item) -> float:
    output_text = sample["output_text"]
    reference_answer = item["reference_answer"]
    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0
"""

STRING_CHECK = {
    "type": "string_check",
    "name": "Example string check grader",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.label }}",
    "operation": "eq",
}
TEXT_SIMILARITY = {
    "type": "text_similarity",
    "name": "Example text similarity grader",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference_answer }}",
    "evaluation_metric": "fuzzy_match",
}
PYTHON = {"type": "python", "name": "Example python grader", "source": FUZZY_SOURCE}
# the guide's tool-call multigrader, reading the sample's JSON instead of output_tools
MULTI = {
    "type": "multi",
    "name": "tool call",
    "graders": {
        "name": {
            "name": "name",
            "type": "string_check",
            "input": "{{ sample.output_json.name }}",
            "reference": "{{ item.name }}",
            "operation": "eq",
        },
        "arguments": {
            "name": "arguments",
            "type": "text_similarity",
            "input": "{{ sample.output_json.arguments }}",
            "reference": "{{ item.arguments }}",
            "evaluation_metric": "fuzzy_match",
        },
    },
    "calculate_output": "0.5 * name + 0.5 * arguments",
}


def typed(raw: dict[str, Any]) -> Any:
    """A grader's JSON as the openai package's typed parameter (a TypedDict)."""
    return raw


@pytest.fixture(scope="module")
def gateway(
    log_dir: Path, verify_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Gateway -> verify, the sandbox (python graders), embedding (cosine; all-MiniLM-L6-v2
    on the CPU)."""
    sandbox, sandbox_url = start_service(
        "sandbox", log_dir, {"SANDBOX_WORKERS": "2", "SANDBOX_NICE": "0"}
    )
    embedding, embedding_url = start_service("embedding", log_dir, {"EMBEDDING_DEVICE": "cpu"})
    deadline = time.monotonic() + 180
    while httpx.get(f"{embedding_url}/readyz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "embedding not ready in 180 s"
        time.sleep(0.2)
    recipes = tmp_path_factory.mktemp("graders") / "recipes.yaml"
    recipes.write_text(json.dumps({"recipes": [{"name": "mixed", "components": [
        {"name": "mixed", "grader": MIXED}]}]}))  # fmt: skip
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url,
           "GATEWAY_SANDBOX_URL": sandbox_url, "GATEWAY_EMBEDDING_URL": embedding_url,
           "GATEWAY_RECIPES_FILE": str(recipes)}  # fmt: skip
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()
    embedding.stop()
    sandbox.stop()


@pytest.fixture(scope="module")
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize(
    ("grader", "sample", "item", "reward"),
    [
        # string_check eq: the label exactly
        (STRING_CHECK, "positive", {"label": "positive"}, 1.0),
        (STRING_CHECK, "Positive", {"label": "positive"}, 0.0),
        # ilike: the reference inside the input, any case
        ({**STRING_CHECK, "operation": "ilike"}, "It is POSITIVE.", {"label": "positive"}, 1.0),
        ({**STRING_CHECK, "operation": "ne"}, "negative", {"label": "positive"}, 1.0),
        # fuzzy_match: rapidfuzz's ratio, 91 on fuzzywuzzy's README example
        (TEXT_SIMILARITY, "fuzzy wuzzy was a bear", {"reference_answer": "wuzzy fuzzy was a bear"},
         0.9090909090909091),
        # python: the guide's rapidfuzz grader, in the sandbox
        (PYTHON, "fuzzy wuzzy was a bear", {"reference_answer": "fuzzy wuzzy was a bear"}, 1.0),
        # multi: a right name (1.0) and identical arguments (1.0)
        (MULTI, '{"name": "get_weather", "arguments": "city=Paris"}',
         {"name": "get_weather", "arguments": "city=Paris"}, 1.0),
        # multi: a wrong name (0.0), identical arguments: 0.5 * 0 + 0.5 * 1
        (MULTI, '{"name": "get_time", "arguments": "city=Paris"}',
         {"name": "get_weather", "arguments": "city=Paris"}, 0.5),
    ],
)  # fmt: skip
def test_run_gives_the_guides_results(
    client: openai.OpenAI, grader: Any, sample: str, item: Any, reward: float
) -> None:
    out = client.fine_tuning.alpha.graders.run(grader=grader, model_sample=sample, item=item)
    assert out.reward == pytest.approx(reward), out
    assert out.metadata.name == grader["name"] and out.metadata.type == grader["type"]
    assert not any(v is True for v in out.metadata.errors.model_dump().values()), out
    if grader["type"] == "multi":
        assert set(out.sub_rewards) == {"name", "arguments"}, out
        assert out.metadata.scores == out.sub_rewards


def test_cosine_compares_embeddings_from_the_embedding_service(client: openai.OpenAI) -> None:
    grader = typed({**TEXT_SIMILARITY, "evaluation_metric": "cosine"})
    item = {"reference_answer": "The cat sat on the mat."}
    runs = client.fine_tuning.alpha.graders.run
    same = runs(grader=grader, model_sample="The cat sat on the mat.", item=item)
    near = runs(grader=grader, model_sample="A cat was sitting on the mat.", item=item)
    far = runs(grader=grader, model_sample="Quarterly revenue rose by 4%.", item=item)
    assert same.reward == pytest.approx(1.0, abs=1e-5), same
    assert near.reward is not None and far.reward is not None
    assert 1.0 > near.reward > far.reward, (near, far)


def test_a_sample_that_is_not_json_fails_the_multi_as_the_responses_fault(
    client: openai.OpenAI,
) -> None:
    item = {"name": "get_weather", "arguments": "x"}
    out = client.fine_tuning.alpha.graders.run(
        grader=typed(MULTI), model_sample="not json", item=item
    )
    assert out.reward == 0.0 and out.metadata.errors.sample_parse_error, out


def test_a_python_grader_that_raises_is_null_with_the_runtime_error(client: openai.OpenAI) -> None:
    source = "def grade(sample, item):\n    raise ValueError('no grade for you')\n"
    grader = {"type": "python", "name": "raises", "source": source}
    out = client.fine_tuning.alpha.graders.run(grader=typed(grader), model_sample="x")
    errors = out.metadata.errors
    assert out.reward is None and errors.python_grader_runtime_error, out
    assert "no grade for you" in (errors.python_grader_runtime_error_details or ""), out


def test_validate_echoes_a_good_grader(client: openai.OpenAI) -> None:
    out = client.fine_tuning.alpha.graders.validate(grader=MULTI)  # type: ignore[arg-type]
    assert out.grader is not None and out.grader.model_dump(exclude_none=True) == MULTI


@pytest.mark.parametrize(
    ("grader", "param", "words"),
    [
        # a metric OpenAI does not have
        ({**TEXT_SIMILARITY, "evaluation_metric": "jaccard"}, "grader.evaluation_metric",
         "fuzzy_match"),
        # meteor: needs WordNet, which cannot be installed from PyPI
        ({**TEXT_SIMILARITY, "evaluation_metric": "meteor"}, "grader.evaluation_metric",
         "unsupported here"),
        # a namespace that is neither sample nor item
        ({**STRING_CHECK, "input": "{{ row.label }}"}, "grader.input", "row.label"),
        # a formula naming no sub-grader
        ({**MULTI, "calculate_output": "name + args"}, "grader.calculate_output", "'args'"),
        # a formula that is not arithmetic
        ({**MULTI, "calculate_output": "__import__('os')"}, "grader.calculate_output",
         "__import__"),
        # a sub-grader's field, by its key
        ({**MULTI, "graders": {"name": {**STRING_CHECK, "operation": "regex"}}},
         "grader.graders.name.operation", "eq"),
        # python source without grade()
        ({**PYTHON, "source": "x = 1"}, "grader.source", "grade(sample, item)"),
    ],
)  # fmt: skip
def test_a_bad_grader_is_422_naming_the_field(
    client: openai.OpenAI, grader: Any, param: str, words: str
) -> None:
    for call in (
        lambda: client.fine_tuning.alpha.graders.validate(grader=grader),
        lambda: client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x"),
    ):
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            call()
        error = caught.value.body
        assert isinstance(error, dict), error
        assert error["param"] == param and words in error["message"], error


def test_an_item_variable_the_item_lacks_is_422_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.fine_tuning.alpha.graders.run(grader=typed(STRING_CHECK), model_sample="x", item={})
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "item", error
    assert "item.label" in error["message"], error


MIXED = {
    "type": "multi",
    "name": "mixed",
    "graders": {
        "exact": {**STRING_CHECK, "name": "exact", "reference": "{{ item.reference }}"},
        "fuzzy": {**TEXT_SIMILARITY, "name": "fuzzy", "reference": "{{ item.reference }}"},
        "py": {
            "type": "python",
            "name": "py",
            "source": "def grade(sample, item):\n"
            "    return float(item['reference'] in sample['output_text'])\n",
        },
    },
    "calculate_output": "(exact + fuzzy + py) / 3",
}


def test_a_multi_grader_scores_through_v1_score_with_its_breakdown(gateway: str) -> None:
    recipe = {"components": [
        {"name": "math_accuracy", "weight": 1.0},
        {"name": "mixed", "weight": 0.5, "grader": MIXED},
    ]}  # fmt: skip
    ref = f"7{time.monotonic_ns() % 1000}"  # nothing cached yet
    group = {"id": "g", "prompt": "p", "reference": ref,
             "responses": [ref, f"it is {ref}", "nope"]}  # fmt: skip
    r = httpx.post(f"{gateway}/v1/score", json={"recipe": recipe, "groups": [group]}, timeout=60)
    assert r.status_code == 200, r.text
    g = r.json()["groups"][0]
    fuzzy_mid = len(ref) * 2 / (len(ref) * 2 + 6)  # Indel similarity of ref, "it is ref"
    expected = [1.0, (0 + fuzzy_mid + 1) / 3, pytest.approx(0.0, abs=0.2)]
    assert g["components"]["mixed"][:2] == pytest.approx(expected[:2]), g
    breakdown = g["info"]["mixed"]["scores"]
    assert breakdown[0] == {"exact": 1.0, "fuzzy": 1.0, "py": 1.0}, g
    assert breakdown[1]["exact"] == 0.0 and breakdown[1]["py"] == 1.0, g
    assert g["rewards"][0] == pytest.approx(1.0 + 0.5 * 1.0), g
    # again: every score from the cache, the breakdown with it
    again = httpx.post(
        f"{gateway}/v1/score", json={"recipe": recipe, "groups": [group]}, timeout=60
    )
    body = again.json()
    assert body["usage"]["cache_hits"] == 6, body
    assert body["groups"][0]["info"]["mixed"]["scores"] == breakdown, body


@pytest.mark.parametrize(
    ("component", "param"),
    [
        # a bad grader inside a recipe: named from the recipe's root
        ({"name": "g", "grader": {**STRING_CHECK, "operation": "regex"}},
         "recipe.components.0.grader.operation"),
        # a grader under a built-in component's name
        ({"name": "format", "grader": STRING_CHECK}, "recipe.components.0.name"),
        # an item variable the group lacks: named when the group is scored
        ({"name": "g", "grader": {**STRING_CHECK, "reference": "{{ item.nope }}"}},
         "recipe.components.0.grader"),
    ],
)  # fmt: skip
def test_a_bad_grader_component_is_422(gateway: str, component: Any, param: str) -> None:
    group = {"prompt": "p", "reference": "r", "responses": [f"x {time.monotonic_ns()}"]}
    body = {"recipe": {"components": [component]}, "groups": [group]}
    r = httpx.post(f"{gateway}/v1/score", json=body, timeout=60)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param, r.text
    # named once, from the recipe's root: no part of the path repeated
    assert error["message"].startswith(f"{param}: "), r.text
    assert ": recipe." not in error["message"] and "grader: grader" not in error["message"]


def test_a_named_recipe_of_graders_scores_through_a_compat_route(gateway: str) -> None:
    """OpenRLHF's remote reward: the sample's text after its prompt, the label as the
    group's reference (the graders' {{ item.reference }})."""
    prompt = f"Capital of France? {time.monotonic_ns()} "
    body = {"query": [prompt + "Paris", prompt + "Lyon"], "prompts": [prompt] * 2,
            "labels": ["Paris"] * 2}  # fmt: skip
    r = httpx.post(f"{gateway}/v1/compat/openrlhf/mixed", json=body, timeout=60)
    assert r.status_code == 200, r.text
    lyon = fuzz.ratio("Lyon", "Paris") / 100  # exact 0, py 0
    assert r.json()["rewards"] == pytest.approx([1.0, lyon / 3]), r.text
