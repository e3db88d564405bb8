"""The judge's ``POST /v1/model_grader``: OpenAI's ``score_model`` and ``label_model``
graders, graded by the judge's model.

The grader's messages (templates already rendered by the gateway) are sent as written,
after one system message of our own that asks for a JSON object ``{"result": ...}``: a
number within ``range`` (default [0, 1]) for ``score_model``, one of ``labels`` for
``label_model`` (OpenAI's shape also has ``steps``, its reasoning: left out, see
``schema``). Where the server takes
``response_format`` (the judge's ``JUDGE_STRUCTURED_OUTPUT``), the shape is a JSON schema
the server enforces (labels as an enum). ``score_model``'s reward is the result;
``label_model``'s is 1.0 when the label is in ``passing_labels``, else 0.0. A reply without
a valid result is null ``judge_parse_error``; a server failure is null with its kind, as
every judge item is. ``model`` is OpenAI's model name: the judge's own model grades here.
Each sample is one call in the caller's team's fair share of the judge's slots, with the
judge's per-item deadline.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from arbiter.errors import ArbiterError, Timeout
from arbiter.proto.graders import (
    ChatMessage,
    LabelModelGrader,
    ModelGraderRequest,
    ModelGraderResponse,
    ModelGraderResult,
    ScoreModelGrader,
)
from arbiter.services.judge.parsing import _THINK, JudgeReplyError, message_text, usage_tokens
from arbiter.services.judge.parsing import _first_json_object as first_json_object
from arbiter.services.judge.scoring import Judge

COMPONENT = "model_grader"
DEFAULT_MAX_TOKENS = 512


def instruction(grader: ScoreModelGrader | LabelModelGrader) -> str:
    if isinstance(grader, ScoreModelGrader):
        lo, hi = grader.range or [0.0, 1.0]
        want = f"your score, a number from {lo:g} to {hi:g}"
    else:
        want = "exactly one of these labels: " + ", ".join(repr(x) for x in grader.labels)
    return (
        f'Reply with one JSON object and nothing else: {{"result": ...}}, the result being {want}.'
    )


def schema(grader: ScoreModelGrader | LabelModelGrader) -> dict[str, Any]:
    """The reply's shape: the result alone (OpenAI's also asks for ``steps``; a result-only
    reply is short, and a reasoning model reasons in its thinking)."""
    result: dict[str, Any]
    if isinstance(grader, ScoreModelGrader):
        result = {"type": "number"}
    else:
        result = {"type": "string", "enum": list(grader.labels)}
    return {
        "type": "object",
        "properties": {"result": result},
        "required": ["result"],
        "additionalProperties": False,
    }


def payload(
    judge: Judge, grader: ScoreModelGrader | LabelModelGrader, messages: list[ChatMessage],
    team: str,
) -> dict[str, Any]:  # fmt: skip
    sp = getattr(grader, "sampling_params", None)
    doc: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": instruction(grader)},
            *({"role": m.role, "content": m.content} for m in messages),
        ],
        "max_tokens": (sp.max_completions_tokens if sp else None) or DEFAULT_MAX_TOKENS,
        **judge.cache_salt(team),
    }
    if sp is not None:
        doc.update({k: v for k in ("temperature", "top_p", "seed")
                    if (v := getattr(sp, k)) is not None})  # fmt: skip
    if judge.settings.structured_output != "none":
        doc["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": grader.type, "schema": schema(grader), "strict": True},
        }
    return doc


def verdict(grader: ScoreModelGrader | LabelModelGrader, text: str) -> tuple[float, Any]:
    """(reward, the model's result) from the reply; JudgeReplyError when it has none."""
    obj = first_json_object(_THINK.sub("", text))  # a reasoning model's <think> left out
    if obj is None or "result" not in obj:
        raise JudgeReplyError("judge_parse_error", f"no JSON result in the reply: {text[:200]!r}")
    result = obj["result"]
    if isinstance(grader, LabelModelGrader):
        if not isinstance(result, str) or result not in grader.labels:
            raise JudgeReplyError("judge_parse_error", f"{result!r} is not one of the labels")
        return float(result in grader.passing_labels), result
    lo, hi = grader.range or [0.0, 1.0]
    ok = isinstance(result, int | float) and not isinstance(result, bool)
    if not ok or not math.isfinite(result) or not lo <= result <= hi:
        raise JudgeReplyError("judge_parse_error", f"result {result!r} is not in [{lo:g}, {hi:g}]")
    return float(result), result


async def grade(judge: Judge, req: ModelGraderRequest, team: str = "") -> ModelGraderResponse:
    request = object()  # this request's key in the judge's fair line
    deadline = asyncio.get_running_loop().time() + judge.settings.timeout_s

    async def one(messages: list[ChatMessage]) -> ModelGraderResult:
        pt = ct = 0
        try:
            async with asyncio.timeout_at(deadline), judge._slots.slot(request, team):
                body = await judge.client.chat(
                    payload(judge, req.params, messages, team), COMPONENT
                )
            pt, ct = usage_tokens(body)
            reward, result = verdict(req.params, message_text(body))
        except TimeoutError:
            message = f"not judged within {judge.settings.timeout_s:g}s (queueing included)"
            return ModelGraderResult(score=None, kind=Timeout.kind, message=message)
        except ArbiterError as exc:  # the server's failure, or its reply's (JudgeReplyError)
            return ModelGraderResult(
                score=None, kind=exc.kind, message=exc.message, prompt_tokens=pt,
                completion_tokens=ct, tokens=pt + ct,
            )  # fmt: skip
        return ModelGraderResult(
            score=reward, result=result, prompt_tokens=pt, completion_tokens=ct, tokens=pt + ct
        )

    return ModelGraderResponse(results=list(await asyncio.gather(*map(one, req.messages))))
