"""``python_grader``'s inputs and the grades it accepts, as OpenAI's Python graders define
them (https://developers.openai.com/api/docs/guides/graders). Pure functions.

- ``sample``: ``output_text`` is the response; ``output_json`` is the response parsed when
  it is JSON (OpenAI: "populated if the model sample is a valid JSON string"), else ``None``.
- ``item``: OpenAI's item is the dataset row. Here a row is a group: its ``prompt``,
  ``reference`` and ``metadata`` (the recipe's ``params.metadata`` under the group's own,
  whose keys win), and the metadata's keys at the top level too, so a grader written for
  OpenAI's rows (``item["reference_answer"]``) reads them where it expects them.
- A grade is accepted when it is a finite number inside ``params.score_range`` (OpenAI's
  graders grade from 0 to 1, the default); anything else is the grader's failure.
"""

from __future__ import annotations

import json
import math
from typing import Any

from arbiter.proto.limits import MAX_JSON_DEPTH


def sample(response: str) -> dict[str, Any]:
    return {"output_text": response, "output_json": _json(response)}


def item(
    prompt: str, reference: str | None, metadata: dict[str, Any], own: dict[str, Any] | None
) -> dict[str, Any]:
    merged = {**metadata, **(own or {})}
    return {**merged, "prompt": prompt, "reference": reference, "metadata": merged}


def out_of_range(grade: float, score_range: tuple[float, float]) -> str | None:
    """Why ``grade`` is not a reward (``None``: it is one)."""
    lo, hi = score_range
    if not math.isfinite(grade):
        return f"grade returned {grade!r}, not a finite number"
    if not lo <= grade <= hi:
        return f"grade returned {grade!r}, outside params.score_range [{lo:g}, {hi:g}]"
    return None


def _json(text: str) -> Any:
    """``text`` parsed as JSON, or ``None``: not JSON, or nested past ``MAX_JSON_DEPTH``."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_JSON_DEPTH:
                return None
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return value
