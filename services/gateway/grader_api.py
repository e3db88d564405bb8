"""``POST /v1/fine_tuning/alpha/graders/run`` and ``/validate``: OpenAI's graders API.

``run`` is a scoring call like any other: the grader becomes a one-component inline recipe
(component ``grader``) over one group of one response, and goes through the lifecycle
(admission with the caller's key, allow-lists and quota; the scorer, so its cache and the
services' fair share; settlement to the team's ledger). Its answer is OpenAI's
``GraderRunResponse``: ``reward`` (null, never 0, when it could not be computed),
``metadata`` (the error flags, ``execution_time``, ``scores``, ``token_usage``) and
``sub_rewards`` (a multi grader's sub-graders by name).
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError

from arbiter.errors import Unprocessable
from arbiter.keys import Principal
from arbiter.proto.components import ScoreGroup
from arbiter.proto.gateway import Recipe, RecipeComponent
from arbiter.proto.graders import (
    GraderErrors,
    GraderRunMetadata,
    GraderRunRequest,
    GraderRunResponse,
    GraderValidateRequest,
    GraderValidateResponse,
)
from arbiter.services.gateway.lifecycle import Lifecycle, Ticket
from arbiter.services.gateway.usage import tally
from arbiter.services.graders import spec as grader_spec
from arbiter.services.graders import templating
from arbiter.services.graders.engine import AnyGrader
from arbiter.services.scoring.grading import check_items, row_item
from arbiter.services.scoring.scoring import Scored

COMPONENT = "grader"  # the component's name in the one-component recipe


def validate(req: GraderValidateRequest) -> GraderValidateResponse:
    """The grader as given, once its templates and formula pass (else 422 naming them)."""
    grader_spec.check(req.grader, "grader")
    return GraderValidateResponse(grader=req.grader)


def _group(req: GraderRunRequest) -> ScoreGroup:
    item: dict[str, Any] = req.item or {}
    prompt, reference = item.get("prompt"), item.get("reference")
    return ScoreGroup(
        prompt=prompt if isinstance(prompt, str) else "",
        reference=reference if isinstance(reference, str) else None,
        responses=[req.model_sample],
        metadata=item or None,
    )


async def run(lifecycle: Lifecycle, who: Principal, req: GraderRunRequest) -> GraderRunResponse:
    grader = req.grader
    grader_spec.check(grader, "grader")
    group = _group(req)
    try:  # the item's variables, before any work: 422 naming the one it lacks
        check_items(grader, [row_item(group.model_dump())])
    except templating.MissingVariable as exc:
        raise Unprocessable(f"item: {exc}", param="item", code="invalid_variable") from None
    raw = grader.model_dump(mode="json", exclude_none=True)
    recipe = Recipe(components=[RecipeComponent(name=COMPONENT, grader=raw)])
    ticket = await lifecycle.admit(who, recipe, 1, param="grader")
    assert isinstance(ticket, Ticket)  # no Idempotency-Key here: never a replay
    async with lifecycle.settling(ticket) as done:
        scored = await lifecycle.scorer.score(ticket.recipe, [group], ticket.scope)
        done.scored(scored)
        out = answer(grader, scored)
        done.answer(tally(scored))
    return out


def _note(scored: Scored) -> dict[str, Any]:
    comp = scored.comps[0]
    note = dict(comp.notes.get((0, 0), {}))
    for key, value in comp.info[0].items():
        if isinstance(value, list) and len(value) == 1:
            note.setdefault(key, value[0])
    return note


def answer(grader: AnyGrader, scored: Scored) -> GraderRunResponse:
    """OpenAI's shape of the one response's score."""
    comp = scored.comps[0]
    reward = comp.scores[0][0]
    note = _note(scored)
    flags: dict[str, Any] = dict(note.get("errors") or {})
    if reward is None and not any(v is True for v in flags.values()):
        kind = comp.errors[0][0][1] if comp.errors[0] else "bad_response"
        flags["unresponsive_reward_error" if kind == "timeout" else "other_error"] = True
    subs = note.get("scores") or {}
    tokens = note.get("token_usage")
    model = getattr(grader, "model", None)
    return GraderRunResponse(
        reward=reward,
        metadata=GraderRunMetadata(
            errors=GraderErrors.model_validate(flags),
            execution_time=round(scored.elapsed_s, 6),
            name=grader.name,
            scores=subs if subs else {grader.name: reward},
            token_usage=tokens,
            type=grader.type,
        ),
        sub_rewards=subs,
        model_grader_token_usage_per_model={model: tokens} if model and tokens else {},
    )


def untagged(exc: RequestValidationError) -> RequestValidationError:
    """The graders API's validation errors with pydantic's union tags out of their
    ``loc`` (``grader.evaluation_metric``, not ``grader.text_similarity.evaluation_metric``)."""
    body = exc.body
    if not isinstance(body, dict) or not isinstance(body.get("grader"), dict):
        return exc
    errors = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if loc[:2] == ("body", "grader"):
            path = grader_spec.path(body["grader"], loc[2:])
            err = {**err, "loc": ("body", "grader", *path)}
        errors.append(err)
    return RequestValidationError(errors, body=body)
