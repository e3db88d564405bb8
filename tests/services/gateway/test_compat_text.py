"""The text handling of the compat routes: markers off the end, the response off the query."""

from __future__ import annotations

import pytest

from arbiter.errors import Unprocessable
from arbiter.services.gateway.compat_text import last_user_text, split_query, strip_markers


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("<answer>4</answer><|im_end|>", "<answer>4</answer>"),  # ChatML / Qwen
        ("<answer>4</answer></s>", "<answer>4</answer>"),  # Llama 2 / Mistral
        ("<answer>4</answer><|eot_id|>", "<answer>4</answer>"),  # Llama 3
        ("<answer>4</answer><|im_end|>\n<|endoftext|>", "<answer>4</answer>"),  # several
        ("<answer>4</answer>\n<end_of_turn>", "<answer>4</answer>"),  # Gemma, with newline
        ("<answer>4</answer>\n", "<answer>4</answer>\n"),  # no marker: left exactly as is
        ("a </s> b", "a </s> b"),  # a marker inside the text is not the end
        ("", ""),
    ],
)
def test_strip_markers(text: str, want: str) -> None:
    assert strip_markers(text) == want


@pytest.mark.parametrize(
    ("query", "prompt", "want"),
    [
        ("PROMPT the response", "PROMPT", " the response"),  # the usual case
        ("<s>PROMPT response", "PROMPT", " response"),  # the decoder added a BOS marker
        ("user:\n  hi\nassistant:\nresp", "user:\nhi\nassistant:\n", "resp"),  # whitespace
        ("anything", "", "anything"),  # no prompt: the whole query is the response
    ],
)
def test_split_query(query: str, prompt: str, want: str) -> None:
    assert split_query(query, prompt, "query.0") == want


def test_split_query_refuses_a_query_without_its_prompt() -> None:
    with pytest.raises(Unprocessable) as err:
        split_query("other text", "PROMPT", "query.3")
    assert err.value.param == "query.3"


@pytest.mark.parametrize(
    ("messages", "want"),
    [
        ("plain prompt", "plain prompt"),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "q"),
        # Responses-API input parts (NeMo Gym): the text parts joined
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_text", "text": "b"},
                    ],
                }
            ],
            "ab",
        ),
        ([{"role": "user", "content": "q1"}, {"role": "assistant", "content": "r"}], "q1"),
    ],
)
def test_last_user_text(messages: object, want: str) -> None:
    assert last_user_text(messages) == want
