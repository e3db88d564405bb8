"""Sample-level routes in other frameworks' shapes: ``/v1/compat/{openrlhf,slime,nemo-gym}/…``.

Each route turns the framework's sample into (prompt, reference, response), hands it to
the group collector (samples of the same prompt that arrive together are scored as one
group, see ``collector``), and renders the one sample's result in the framework's shape:
the recipe total plus every component. The recipe is named by the path; its fingerprint
comes back in the ``X-Arbiter-Recipe-Fingerprint`` header. Reading the text out of each
framework's shape is ``compat_text``'s; every text is checked against the contract's
bounds here, before admission, so an oversize one is a 422 naming its field.

Each request goes through the same lifecycle as ``/v1/score`` (``lifecycle.py``):
admission (allow-lists, the quota: one response per sample), scoring, one settlement on
every way out (a failure or a client that left is refunded what never started).

Null scores. OpenRLHF and slime turn every value into a tensor and have no "no signal"
value, so a sample whose score could not be computed is answered with an error (503/504
when retrying can help, which both frameworks do; 422 ``unscorable`` otherwise) unless
the caller names a fill value with ``?null_reward=`` (or ``GATEWAY_COMPAT_NULL_REWARD``):
then every null becomes that value and ``masked`` is 1.0. NeMo Gym has a field for it:
``mask_sample: true`` with the reward set to the fill value (default 0.0).
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from prometheus_client import Counter
from pydantic import BaseModel

from arbiter.errors import Timeout, Unavailable, Unprocessable
from arbiter.keys import Principal
from arbiter.proto.compat import (
    NemoGymVerifyRequest,
    NemoGymVerifyResponse,
    OpenRLHFRequest,
    OpenRLHFResponse,
    SlimeRequest,
    SlimeResponse,
)
from arbiter.proto.components import MAX_TEXT_CHARS
from arbiter.proto.errors import RETRYABLE_KINDS
from arbiter.services.common.app import ERROR_RESPONSES
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway.auth import principal
from arbiter.services.gateway.collector import GroupCollector, GroupKey, SampleScore
from arbiter.services.gateway.compat_text import (
    REFERENCE_FIELDS,
    as_reference,
    last_user_text,
    nemo_gym_texts,
    split_query,
    strip_markers,
)
from arbiter.services.gateway.lifecycle import Lifecycle, Ticket
from arbiter.services.gateway.settings import GatewaySettings

router = APIRouter(tags=["compat"], responses=ERROR_RESPONSES)

COMPAT_REQUESTS = Counter(
    "arbiter_gateway_compat_requests_total",
    "Sample-level (compat) requests by framework and outcome.",
    ["framework", "outcome"],
)

# --- dependencies -------------------------------------------------------------------
_GROUP_SIZE = Query(
    ge=1,
    le=256,
    description="Score as soon as this many samples of a prompt have arrived "
    "(set it to the rollouts per prompt).",
)
_WINDOW_MS = Query(
    ge=0,
    description="How long the first sample of a group waits for the rest "
    "(default GATEWAY_COMPAT_WINDOW_MS).",
)
_NULL_REWARD = Query(
    allow_inf_nan=False,
    description="Fill value for a score that could not be computed "
    "(default GATEWAY_COMPAT_NULL_REWARD; unset = an error answer).",
)


@dataclass(frozen=True)
class Options:
    """The query parameters every compat route takes, with the settings' defaults."""

    group_size: int | None
    window_s: float | None
    null_reward: float | None
    who: Principal  # the caller: allow-lists, quota, and the team its samples are grouped in
    lifecycle: Lifecycle
    collector: GroupCollector


async def _options(
    request: Request,
    group_size: Annotated[int | None, _GROUP_SIZE] = None,
    window_ms: Annotated[float | None, _WINDOW_MS] = None,
    null_reward: Annotated[float | None, _NULL_REWARD] = None,
) -> Options:
    # async: a class or a plain `def` dependency would run on the threadpool. One
    # dependency that reads the app's state: FastAPI solves every nested one per request.
    state = request.app.state
    settings: GatewaySettings = state.settings
    if window_ms is not None and window_ms > settings.compat_max_window_ms:
        raise Unprocessable(
            f"window_ms: at most {settings.compat_max_window_ms:g} (GATEWAY_COMPAT_MAX_WINDOW_MS)",
            param="window_ms",
        )
    return Options(
        group_size=group_size,
        window_s=None if window_ms is None else window_ms / 1000,
        null_reward=settings.compat_null_reward if null_reward is None else null_reward,
        who=principal(request),
        lifecycle=state.lifecycle,
        collector=state.compat_collector,
    )


OptionsDep = Annotated[Options, Depends(_options)]

# --- the lifecycle of a compat request ---------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One sample's texts, each with the request field it came from (for a 422)."""

    prompt: tuple[str, str]
    reference: tuple[str | None, str]
    response: tuple[str, str]

    def checked(self) -> tuple[str, str | None, str]:
        for text, param in (self.prompt, self.reference, self.response):
            if text is not None and len(text) > MAX_TEXT_CHARS:
                raise Unprocessable(
                    f"{param}: longer than {MAX_TEXT_CHARS} characters",
                    param=param,
                    code="text_too_long",
                )
        return self.prompt[0], self.reference[0], strip_markers(self.response[0])


Shape = Callable[[list[SampleScore]], BaseModel]


async def _answer(
    framework: str, recipe: str, samples: list[Sample], opts: Options, param: str, shape: Shape
) -> JSONBody:
    """Admit, score through the collector, settle, answer ``shape``'s model."""
    texts = [s.checked() for s in samples]  # 422 before admission: nothing is taken
    lifecycle = opts.lifecycle
    ticket = await lifecycle.admit(opts.who, recipe, len(texts), param=param)
    assert isinstance(ticket, Ticket)  # no Idempotency-Key here: never a replay
    try:
        async with lifecycle.settling(ticket) as done:
            scores = await _collect(recipe, ticket, texts, opts)
            done.judge_tokens = sum(s.judge_tokens for s in scores)
            done.writes = [w for s in scores for w in s.writes]
            out = shape(scores)  # an error answer (unscorable, 503) settles unanswered
            counts: Tally[str] = sum((s.counts for s in scores), Tally())
            counts["requests"] = 1
            done.answer(counts)
    except Exception:
        COMPAT_REQUESTS.labels(framework, "failed").inc()
        raise
    COMPAT_REQUESTS.labels(framework, "ok").inc()
    headers = {"X-Arbiter-Recipe-Fingerprint": ticket.recipe.ref.fingerprint}
    return JSONBody(out, headers=headers)


async def _collect(
    recipe: str, ticket: Ticket, texts: list[tuple[str, str | None, str]], opts: Options
) -> list[SampleScore]:
    scope = ticket.scope
    results = await asyncio.gather(
        *(
            opts.collector.submit(
                GroupKey(recipe, prompt, reference, scope.team, scope.cache, scope.weight),
                ticket.recipe,
                response,
                scope.progress,
                (0, i),
                window_s=opts.window_s,
                group_size=opts.group_size,
            )
            for i, (prompt, reference, response) in enumerate(texts)
        ),
        return_exceptions=True,  # every sample settles before the request does
    )
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [r for r in results if isinstance(r, SampleScore)]


def _fill(score: SampleScore, null_reward: float | None) -> tuple[float, dict[str, float], float]:
    """(total, components, masked) with no nulls left, or the error that says why not."""
    nulls = score.reward is None or any(v is None for v in score.components.values())
    if not nulls:
        comps = {k: float(v) for k, v in score.components.items() if v is not None}
        return float(score.reward), comps, 0.0  # type: ignore[arg-type]
    if null_reward is None:
        raise _unscorable(score)
    comps = {k: null_reward if v is None else v for k, v in score.components.items()}
    reward = null_reward if score.reward is None else score.reward
    return reward, comps, 1.0


def _errors_text(score: SampleScore) -> str:
    return "; ".join(f"{e['component']}: {e['kind']} ({e['message']})" for e in score.errors)


def _unscorable(score: SampleScore) -> Exception:
    why = _errors_text(score)
    message = (
        f"the reward could not be computed: {why or 'a component returned null'}. "
        "Add ?null_reward=<value> to the URL (or set GATEWAY_COMPAT_NULL_REWARD) to get "
        "that value instead, marked masked"
    )[:2000]
    kinds = {e["kind"] for e in score.errors}
    if kinds and kinds <= {"timeout"}:
        return Timeout(message, code="component_timeout")
    if kinds and kinds <= RETRYABLE_KINDS:
        return Unavailable(message, code="component_unavailable")
    return Unprocessable(message, code="unscorable")


# --- routes ---------------------------------------------------------------------------


@router.post(
    "/v1/compat/openrlhf/{recipe}",
    response_model=OpenRLHFResponse,
    summary="OpenRLHF --reward.remote_url: rewards, scores and extra_logs per query",
)
async def openrlhf(recipe: str, body: OpenRLHFRequest, opts: OptionsDep) -> JSONBody:
    labels = body.labels or [None] * len(body.query)
    samples = [
        Sample(
            (prompt, f"prompts.{i}"),
            (as_reference(label), f"labels.{i}"),
            (split_query(q, prompt, f"query.{i}"), f"query.{i}"),
        )
        for i, (q, prompt, label) in enumerate(zip(body.query, body.prompts, labels, strict=True))
    ]

    def shape(scores: list[SampleScore]) -> OpenRLHFResponse:
        filled = [_fill(s, opts.null_reward) for s in scores]
        rewards = [f[0] for f in filled]
        logs = {name: [f[1][name] for f in filled] for name in filled[0][1]}
        logs["masked"] = [f[2] for f in filled]
        return OpenRLHFResponse(rewards=rewards, scores=rewards, extra_logs=logs)

    return await _answer("openrlhf", recipe, samples, opts, "query", shape)


@router.post(
    "/v1/compat/slime/{recipe}",
    response_model=SlimeResponse,
    summary="slime --rm-type remote_rm: the total under 'reward' and each component",
)
async def slime(recipe: str, body: SlimeRequest, opts: OptionsDep) -> JSONBody:
    sample = Sample(
        (last_user_text(body.prompt), "prompt"),
        (as_reference(body.label), "label"),
        (body.response, "response"),
    )

    def shape(scores: list[SampleScore]) -> SlimeResponse:
        reward, comps, masked = _fill(scores[0], opts.null_reward)
        return SlimeResponse.model_validate({**comps, "reward": reward, "masked": masked})

    return await _answer("slime", recipe, [sample], opts, "response", shape)


# Arbiter's error kinds in NeMo Gym's failure vocabulary (nemo_gym/failure_kinds.py);
# the rest are namespaced "arbiter:<kind>", which NeMo Gym accepts.
NEMO_GYM_KINDS = {
    "timeout": "transport_timeout",
    "unavailable": "provider_unavailable",
    "judge_parse_error": "judge_unparseable",
    "judge_no_label": "judge_failed",
    "judge_unsupported": "judge_failed",
}


_REFERENCE_FIELD = Query(
    max_length=128,
    description="The dataset field holding the reference "
    f"(default: the first of {', '.join(REFERENCE_FIELDS)} that is present).",
)


@router.post(
    "/v1/compat/nemo-gym/{recipe}/verify",
    response_model=NemoGymVerifyResponse,
    summary="NeMo Gym resources-server /verify: the request echoed back with its reward",
)
async def nemo_gym_verify(
    recipe: str,
    body: NemoGymVerifyRequest,
    opts: OptionsDep,
    reference_field: Annotated[str | None, _REFERENCE_FIELD] = None,
) -> JSONBody:
    (prompt, reference, response), field_name = nemo_gym_texts(body, reference_field)
    sample = Sample(
        (prompt, "responses_create_params.input"),
        (reference, field_name or "reference"),
        (response, "response.output"),
    )

    def shape(scores: list[SampleScore]) -> NemoGymVerifyResponse:
        score = scores[0]
        comps = {k: float(v) for k, v in score.components.items() if v is not None}
        failure_kind = failure_reason = None
        if score.errors:
            first = score.errors[0]["kind"]
            failure_kind = NEMO_GYM_KINDS.get(first, f"arbiter:{first}")
            failure_reason = _errors_text(score)[:2000]
        reward = score.reward if score.reward is not None else (opts.null_reward or 0.0)
        return NemoGymVerifyResponse.model_validate(
            {
                **body.model_dump(),
                **comps,  # top level too: NeMo Gym's aggregate metrics read top-level numbers
                "reward": reward,
                "reward_components": comps,
                "mask_sample": score.reward is None,
                "failure_kind": failure_kind,
                "failure_reason": failure_reason,
            }
        )

    return await _answer("nemo-gym", recipe, [sample], opts, "response", shape)
