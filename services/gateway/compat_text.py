"""The framework-shaped samples of the compat routes as plain text: (prompt, reference,
response).

OpenRLHF sends the decoded prompt + response as one ``query`` (``split_query`` cuts the
response off), slime and NeMo Gym send chat messages (``last_user_text``), and decoders
leave end-of-turn markers at the end of a response (``strip_markers``). The routes that
use these are in ``compat``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import JsonValue

from arbiter.errors import Unprocessable
from arbiter.proto.compat import NemoGymVerifyRequest

# Chat end-of-turn and end-of-sequence markers that decoders leave at the end of a
# response (OpenRLHF decodes with skip_special_tokens=False): ChatML/Qwen, Llama 2/3,
# Mistral, Gemma, Phi, GPT-2/NeoX, DeepSeek, gpt-oss, and padding.
END_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "</s>",
    "<end_of_turn>",
    "<eos>",
    "<|end|>",
    "<|return|>",
    "<｜end▁of▁sentence｜>",
    "<|pad|>",
    "<pad>",
)


def strip_markers(text: str) -> str:
    """The response without the end-of-turn/EOS markers (and whitespace) it ends with;
    whitespace alone is kept. Linear in the text (a regex anchored at the end rescans
    every run of whitespace: a 200k-space response held the loop for minutes)."""
    end = len(text)
    found = False
    while True:
        while end and text[end - 1].isspace():
            end -= 1
        marker = next((m for m in END_MARKERS if text.endswith(m, 0, end)), None)
        if marker is None:
            break
        end -= len(marker)
        found = True
    return text[:end] if found else text


def split_query(query: str, prompt: str, param: str) -> str:
    """The response part of ``query`` (= prompt + response, as OpenRLHF decodes it)."""
    if query.startswith(prompt):
        return query[len(prompt) :]
    at = query.find(prompt) if prompt else -1
    if at >= 0:  # a marker the decoder put before the prompt (a BOS token)
        return query[at + len(prompt) :]
    # Decoding can change whitespace around special tokens: match the prompt's characters
    # in order, ignoring whitespace on both sides.
    q = 0
    for ch in prompt:
        if ch.isspace():
            continue
        while q < len(query) and query[q].isspace():
            q += 1
        if q >= len(query) or query[q] != ch:
            raise Unprocessable(
                f"{param}: the query does not start with its prompt, so the response cannot "
                "be split off (query must be the prompt followed by the response)",
                param=param,
                code="prompt_mismatch",
            )
        q += 1
    # the whitespace the prompt ends with (ChatML's "assistant\n") belongs to the prompt
    trailing = len(prompt) - len(prompt.rstrip())
    while trailing and q < len(query) and query[q].isspace():
        q, trailing = q + 1, trailing - 1
    return query[q:]


def as_reference(label: JsonValue) -> str | None:
    if label is None:
        return None
    if isinstance(label, str):
        return label
    if isinstance(label, bool | int | float):
        return str(label)

    return json.dumps(label, ensure_ascii=False)


def message_text(content: Any) -> str:
    """A chat message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def last_user_text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages
    if isinstance(messages, list):
        for msg in reversed(messages):
            if isinstance(msg, dict) and msg.get("role", "user") == "user":
                return message_text(msg.get("content"))
    return ""


# NeMo Gym rows carry the dataset's fields: the reference is the first of these present.
REFERENCE_FIELDS = ("expected_answer", "reference", "label", "answer", "ground_truth")


def nemo_gym_texts(
    body: NemoGymVerifyRequest, reference_field: str | None
) -> tuple[tuple[str, str | None, str], str | None]:
    """((prompt, reference, response), the field the reference came from) of a NeMo Gym
    verify request."""
    params = body.responses_create_params
    prompt = last_user_text(params.get("input"))
    extra = body.model_extra or {}
    fields = (reference_field,) if reference_field else REFERENCE_FIELDS
    found = next((f for f in fields if extra.get(f) is not None), None)
    reference = None if found is None else as_reference(extra[found])
    texts = []
    for item in _list(body.response.get("output")):
        if isinstance(item, dict) and item.get("type", "message") == "message":
            for part in _list(item.get("content")):
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text", "")))
    return (prompt, reference, "".join(texts)), found


def _list(value: Any) -> list[Any]:
    """``value`` if it is a list, else nothing (a hostile shape reads as no text)."""
    return value if isinstance(value, list) else []
