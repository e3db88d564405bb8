"""A grader's JSON, checked once (a recipe's load, a request's admission): the model
(``arbiter.proto.graders``), every template's variables, ``calculate_output``. Every
refusal is a 422 naming the field as the caller wrote it (``grader.evaluation_metric``,
``grader.graders.name_check.input``).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from arbiter.errors import Unprocessable
from arbiter.proto.graders import (
    Grader,
    LabelModelGrader,
    MultiGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from arbiter.services.graders import expression, templating
from arbiter.services.graders.engine import AnyGrader, content_text

GRADER: TypeAdapter[AnyGrader] = TypeAdapter(Grader)


def path(raw: Any, loc: tuple[int | str, ...]) -> list[str]:
    """``loc`` as the caller's path: pydantic's union labels (``text_similarity``,
    ``dict[...]``) dropped. A step that is not a key of the object it is under is a label;
    the last step stays (a missing field is named by it)."""
    out: list[str] = []
    node = raw
    for i, step in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and step not in node and not last:
            continue  # a union's label, not a key of the caller's
        out.append(str(step))
        if isinstance(node, dict):
            node = node.get(step)
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        else:
            node = None
    return out


def load(raw: Any, where: str = "grader") -> AnyGrader:
    """The grader ``raw`` describes; Unprocessable naming the field otherwise."""
    try:
        grader = GRADER.validate_python(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join([where, *path(raw, err["loc"])])
        message = err["msg"].removeprefix("Value error, ")
        raise Unprocessable(f"{param}: {message}", param=param, code="invalid_grader") from None
    check(grader, where)
    return grader


def _template(template: str, param: str) -> None:
    try:
        templating.check(template)
    except templating.TemplateError as exc:
        raise Unprocessable(f"{param}: {exc}", param=param, code="invalid_variable") from None


def check(grader: AnyGrader, where: str) -> None:
    """Templates and formula: what the model alone does not check."""
    if isinstance(grader, MultiGrader):
        named = grader.named()
        try:
            expression.parse(grader.calculate_output, frozenset(named))
        except expression.FormulaError as exc:
            param = f"{where}.calculate_output"
            raise Unprocessable(f"{param}: {exc}", param=param, code="invalid_formula") from None
        dict_form = isinstance(grader.graders, dict)
        for key, sub in named.items():
            check(sub, f"{where}.graders.{key}" if dict_form else f"{where}.graders")
    elif isinstance(grader, ScoreModelGrader | LabelModelGrader):
        for i, message in enumerate(grader.input):
            _template(content_text(message.content), f"{where}.input.{i}.content")
    elif isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        _template(grader.input, f"{where}.input")
        _template(grader.reference, f"{where}.reference")


def templates(grader: AnyGrader) -> list[str]:
    """Every template the grader (and its sub-graders) renders."""
    if isinstance(grader, MultiGrader):
        return [t for g in grader.named().values() for t in templates(g)]
    if isinstance(grader, ScoreModelGrader | LabelModelGrader):
        return [content_text(m.content) for m in grader.input]
    if isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        return [grader.input, grader.reference]
    return []


def uses(grader: AnyGrader) -> set[str]:
    """The services grading needs: ``embedding``, ``sandbox``, ``judge`` (none: pure)."""
    if isinstance(grader, MultiGrader):
        return set().union(*(uses(g) for g in grader.named().values()))
    kind = grader.type
    if kind == "python":
        return {"sandbox"}
    if kind in ("score_model", "label_model"):
        return {"judge"}
    if kind == "text_similarity" and getattr(grader, "evaluation_metric", "") == "cosine":
        return {"embedding"}
    return set()
