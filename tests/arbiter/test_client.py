"""The Python client and the TRL adapter against the real gateway + verify + Redis."""

from __future__ import annotations

import pytest

from arbiter.client import ArbiterClient, ArbiterError, trl_reward

GOOD = "<think>9 + 9 = 18</think><answer>18</answer>"
WRONG = "<think>guess</think><answer>17</answer>"
BARE = "The answer is 18."


def test_score_returns_typed_response(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url)
    out = client.score([{"id": "q", "prompt": "9+9?", "reference": "18",
                         "responses": [GOOD, WRONG, BARE]}])  # fmt: skip
    g = out.groups[0]
    assert g.components["math_accuracy"] == [1.0, 0.0, 1.0]
    assert g.components["format"] == [1.0, 1.0, 0.0]
    assert g.rewards == [1.5, 0.5, 1.0]  # gsm8k = 1.0·math + 0.5·format
    assert out.recipe.fingerprint.startswith("sha256:")
    client.close()


async def test_async_score(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url)
    out = await client.ascore([{"reference": "18", "responses": [GOOD]}], "gsm8k")
    assert out.groups[0].rewards == [1.5]
    await client.aclose()


def test_bad_input_raises_with_envelope(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url)
    with pytest.raises(ArbiterError) as info:
        client.score([{"reference": "18", "responses": [GOOD]}], "no-such-recipe")
    assert info.value.status in (400, 422) and not info.value.retryable
    assert info.value.error is not None and info.value.error.param == "recipe"


def test_trl_reward_regroups_repeated_prompts(gateway_url: str) -> None:
    # TRL's batch: each prompt repeated num_generations (here 2) times in a row,
    # conversational completions, and the dataset's `answer` column passed as a kwarg.
    reward = trl_reward("gsm8k", base_url=gateway_url, reference_column="answer")
    prompts = [[{"role": "user", "content": "9+9?"}]] * 2 + [
        [{"role": "user", "content": "2+2?"}]
    ] * 2
    completions = [[{"role": "assistant", "content": c}] for c in (GOOD, WRONG, BARE, "4")]
    answer = ["18", "18", "#### 4", "#### 4"]
    rewards = reward(prompts=prompts, completions=completions, answer=answer)
    assert rewards == [1.5, 0.5, 0.0, 1.0]  # BARE says 18 for 2+2; "4" is right, unformatted
    assert reward.__name__ == "arbiter_gsm8k"
