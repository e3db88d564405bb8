"""The failure vocabulary on the wire: envelope types, item kinds, and which are retryable.

A failure has one of two shapes. A request that fails answers an HTTP status and the
envelope ``{"error": {"type", "message", "param", "code"}}``, whose ``type`` is an
``ErrorType``. A score that could not be computed is ``null`` plus an ``ItemError``, whose
``kind`` is an ``ErrorKind``. ``arbiter.errors`` is the one place that maps an exception to
its status, type and kind; this module only names them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbiter.proto.common import ArbiterModel

ErrorType = Literal[
    "invalid_request_error",  # 400, 422 (and any other 4xx): bad input; `param` names the field
    "authentication_error",  # 401: no API key, or an unknown or revoked one
    "permission_error",  # 403: the key's team may not use this recipe, component or route
    "conflict",  # 409: a request with the same Idempotency-Key is still in flight
    "payload_too_large",  # 413: past a size limit; split the request
    "not_found",  # 404: no such route, recipe or model
    "rate_limited",  # 429: over a quota or a queue bound; retry after a pause
    "unavailable",  # 503: a dependency is down or not configured; retry
    "timeout",  # 504: past a deadline; retry
    "internal_error",  # 500: a bug; 502: a service we called answered outside its contract
]

# Why a score is null. Retryable kinds first.
ErrorKind = Literal[
    "timeout",  # the item or the component ran past its deadline
    "unavailable",  # the service was unreachable, overloaded (429) or answered 5xx
    "bad_response",  # the service refused the request (4xx) or answered outside the contract
    "internal",  # the component raised while scoring this item
    "invalid_reference",  # the reference could not be parsed into a value
    "group_too_small",  # a group-level component needs at least two responses
    "empty_response",  # the response is empty or whitespace: nothing to embed (diversity)
    "judge_parse_error",  # the judge's text held no score
    "judge_no_label",  # neither Yes nor No in the judge's top log-probs
    "judge_unsupported",  # the judge server ignored a feature the component needs
    "sandbox_error",  # the sandbox itself failed (could not start, or died without answering)
    "grader_error",  # a python_grader raised, overran, or returned no finite number
]

# The kinds worth trying again unchanged: the same request may succeed a moment later.
# Every other kind fails the same way on every attempt. An HTTP status is retryable when
# its error's kind is (``arbiter.errors.is_retryable_status``): 429 and 5xx.
RETRYABLE_KINDS: frozenset[ErrorKind] = frozenset({"timeout", "unavailable"})


class ErrorBody(ArbiterModel):
    type: ErrorType
    message: str
    param: str | None = Field(default=None, description="The offending field, dotted path.")
    code: str | None = Field(default=None, description="Machine-readable reason.")


class ErrorResponse(ArbiterModel):
    """``{"error": {"type", "message", "param", "code"}}`` — every non-2xx body."""

    error: ErrorBody


class ItemError(ArbiterModel):
    index: int = Field(ge=0, description="Index of the response inside its group.")
    kind: ErrorKind
    message: str
