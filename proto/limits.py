"""Request limits: the contract's ceilings, and the per-request bound a service sets.

Counts and lengths of single fields (groups per request, responses per group, characters
per text) are part of the wire contract: the gateway forwards its caller's groups to the
component services unchanged, so every hop must accept what the first one accepted. They
are ``Field`` bounds on the models and appear in the OpenAPI schema.

The total characters of one request is a deployment's choice (``<PREFIX>_MAX_TOTAL_CHARS``
per service). The service's body-limit middleware puts the bound in force for the request
in ``REQUEST_LIMITS``; the request models check it while they validate, so a request past
it is refused before any work, with ``param`` naming the text at which it crossed. Outside
a service (a client building a request) the contract's default applies.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from pydantic_core import PydanticCustomError

MAX_GROUPS = 1024  # groups per request
MAX_RESPONSES = 256  # responses per group
MAX_TEXT_CHARS = 100_000  # characters per prompt, reference or response
MAX_TOTAL_CHARS = 16_000_000  # characters of every text of one request (default bound)
MAX_JSON_DEPTH = 32  # nesting of free-form JSON (params, compat payloads)
MAX_WEIGHT = 1e6  # |weight| of a recipe component: 16 weights times any finite score stay finite


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The bounds in force for the request being validated."""

    max_total_chars: int = MAX_TOTAL_CHARS


DEFAULT_LIMITS = RequestLimits()
REQUEST_LIMITS: ContextVar[RequestLimits | None] = ContextVar(
    "arbiter_request_limits", default=None
)


def current_limits() -> RequestLimits:
    """The bounds in force: the service's for this request, else the contract's default."""
    return REQUEST_LIMITS.get() or DEFAULT_LIMITS


class _Group(Protocol):
    prompt: str
    reference: str | None
    responses: list[str]


def check_total_chars(groups: Iterable[_Group], param: str = "groups") -> None:
    """Refuse (422 ``too_many_chars``) groups whose texts hold more characters than the
    request's bound; ``param`` of the error names the text at which the total crossed it."""
    limit = current_limits().max_total_chars
    total = 0
    for i, group in enumerate(groups):
        before = total
        total += len(group.prompt) + len(group.reference or "")
        total += sum(map(len, group.responses))
        if total > limit:
            _crossed(groups_param=f"{param}.{i}", group=group, before=before, limit=limit)


def check_texts_total(texts: list[str], param: str) -> None:
    """The same bound for a flat list of texts (``/v1/embeddings`` input)."""
    limit = current_limits().max_total_chars
    if sum(map(len, texts)) <= limit:
        return
    total = 0
    for j, text in enumerate(texts):
        total += len(text)
        if total > limit:
            raise _too_many(f"{param}.{j}", limit)


def _crossed(groups_param: str, group: _Group, before: int, limit: int) -> None:
    """Raise for the text of ``group`` at which the running total first passes ``limit``."""
    total = before + len(group.prompt)
    if total > limit:
        raise _too_many(f"{groups_param}.prompt", limit)
    total += len(group.reference or "")
    if total > limit:
        raise _too_many(f"{groups_param}.reference", limit)
    for j, text in enumerate(group.responses):
        total += len(text)
        if total > limit:
            raise _too_many(f"{groups_param}.responses.{j}", limit)


def _too_many(param: str, limit: int) -> PydanticCustomError:
    return PydanticCustomError(
        "too_many_chars",
        "the request's texts hold more than {limit} characters in all (at {param}); "
        "split the request",
        {"limit": limit, "param": param},
    )


def check_json_depth(value: object, max_depth: int = MAX_JSON_DEPTH) -> object:
    """Refuse (422 ``too_deep``) free-form JSON nested deeper than ``max_depth``; iterative,
    so a deep value cannot exhaust the stack here or later (hashing, logging, encoding)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= max_depth:
            raise PydanticCustomError(
                "too_deep",
                "nested more than {max_depth} levels deep",
                {"max_depth": max_depth},
            )
        stack.extend((child, depth + 1) for child in children)
    return value
