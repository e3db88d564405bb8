"""One failure vocabulary: every error knows its HTTP status, envelope type, item kind and
whether trying again can help.

A flat hierarchy (after Prime Intellect's verifiers): bad input is an ``InvalidRequest``
(4xx, not retryable; ``NotConfigured``, 422, when the recipe needs a component service the
deployment has not configured), a dependency that is down or overloaded is ``Unavailable`` or
``RateLimited`` (503/429, retryable), a deadline is ``Timeout`` (504, retryable), a reply
outside the contract is ``BadResponse``, one item's own reason (an unparsable reference,
a judge reply without a score) is an ``ItemFailure``. The wire names themselves live in
``arbiter.proto.errors``.

The boundaries, each written once here:

- out of a service: ``to_envelope(exc)`` gives the status and the envelope for any
  exception (the app-level handlers use it); ``item_error(index, exc)`` gives the
  ``ItemError`` that stands beside a null score, so one item's failure never fails a batch;
- into a caller: ``from_response(status, body)`` rebuilds the error from an HTTP answer
  (the client, the gateway's fan-out, the judge's calls to its server, the trainer).

An answer is classified by its status, the one thing a proxy or a foreign server is sure
to send: 504 is a ``Timeout``; 429 is ``RateLimited``; every other 5xx means the service
is ``Unavailable`` to its caller, whatever broke inside it; a 4xx is the request's fault.
The envelope's message, ``param``, ``code`` and ``type`` are kept when the body is one.

Needs pydantic and ``arbiter.proto`` only, so the client imports it without the service
extras.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from arbiter.proto.errors import (
    RETRYABLE_KINDS,
    ErrorBody,
    ErrorKind,
    ErrorResponse,
    ErrorType,
    ItemError,
)

MAX_MESSAGE_CHARS = 1000
NOT_CONFIGURED = "component_not_configured"  # the code of a ``NotConfigured`` (422)


class ArbiterError(Exception):
    """The base of every Arbiter error; raised as itself it is a bug (500, ``internal``)."""

    status: int = 500
    type: ErrorType = "internal_error"
    kind: ErrorKind = "internal"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:  # an answer's real status (e.g. 405 for an InvalidRequest)
            self.status = status

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later (see ``RETRYABLE_KINDS``)."""
        return self.kind in RETRYABLE_KINDS

    @property
    def error(self) -> ErrorBody:
        return ErrorBody(type=self.type, message=self.message, param=self.param, code=self.code)

    def envelope(self) -> ErrorResponse:
        return ErrorResponse(error=self.error)

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers the answer carries besides the envelope (``Retry-After`` on a 429)."""
        return {}


class InvalidRequest(ArbiterError):
    """The request is wrong as given: fix it, do not retry it. A caller whose own request
    was refused this way records the item as ``bad_response`` (it broke the contract)."""

    status = 400
    type: ErrorType = "invalid_request_error"
    kind: ErrorKind = "bad_response"


class BadRequest(InvalidRequest):
    """400: a value the service cannot use (named in ``param``)."""


class Unprocessable(InvalidRequest):
    """422: the body does not validate, or names something unknown (a recipe, a param)."""

    status = 422


class NotConfigured(Unprocessable):
    """422 ``component_not_configured``: the recipe needs a component service this
    deployment has not configured (no judge, no embedding). Refused before any work; not
    retryable: the same request fails until the deployment changes. The message names the
    component and how to add it (compose, ``arbiter up``, the setting)."""

    def __init__(self, message: str, *, param: str | None = "recipe", **kwargs: Any) -> None:
        kwargs.setdefault("code", NOT_CONFIGURED)
        super().__init__(message, param=param, **kwargs)


class PayloadTooLarge(InvalidRequest):
    """413: past a size limit; split the request."""

    status = 413
    type = "payload_too_large"


class UnsupportedMediaType(InvalidRequest):
    """415: the body is not JSON (send ``Content-Type: application/json``)."""

    status = 415


class NotFound(InvalidRequest):
    """404: no such route, recipe or model."""

    status = 404
    type = "not_found"


class Unauthorized(InvalidRequest):
    """401: no ``Authorization: Bearer <key>``, or a key the gateway does not know (or
    revoked). The message never repeats the key."""

    status = 401
    type = "authentication_error"


class Forbidden(InvalidRequest):
    """403: a valid key whose team may not use this recipe, component or route."""

    status = 403
    type = "permission_error"


class Conflict(InvalidRequest):
    """409: a request with the same ``Idempotency-Key`` is still being scored."""

    status = 409
    type = "conflict"


class RateLimited(ArbiterError):
    """429: over a quota or a queue bound; retry after a pause (``retry_after`` seconds,
    sent as the ``Retry-After`` header when set)."""

    status = 429
    type = "rate_limited"
    kind = "unavailable"
    retry_after: float | None = None

    @property
    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class Unavailable(ArbiterError):
    """503: a service or dependency is down, not configured, or answered a 5xx."""

    status = 503
    type = "unavailable"
    kind = "unavailable"


class Timeout(ArbiterError):
    """504: past a deadline (an item's, a call's, or a whole request's)."""

    status = 504
    type = "timeout"
    kind = "timeout"


class BadResponse(ArbiterError):
    """502: a service we called answered, but not in its contract (a body that does not
    parse, a wrong number of scores). Retrying gets the same answer."""

    status = 502
    kind = "bad_response"


class ItemFailure(ArbiterError):
    """One item could not be scored for a reason of its own (``invalid_reference``,
    ``judge_parse_error``…); it becomes an item error, never a request's failure."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_BY_STATUS: dict[int, type[ArbiterError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        Unprocessable,
        RateLimited,
        Timeout,
    )
}


def error_class(status: int) -> type[ArbiterError]:
    """The class an HTTP answer with ``status`` stands for (see the module docstring)."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return Unavailable if status >= 500 else InvalidRequest


def is_retryable_status(status: int) -> bool:
    """429 and every 5xx: the answers worth retrying unchanged."""
    return error_class(status).kind in RETRYABLE_KINDS


def _body_message(body: Any) -> str:
    """The message inside a foreign error body (OpenAI/vLLM ``{"error": {"message"}}``,
    FastAPI ``{"detail"}``), or the text itself."""
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)
    return str(body)


def from_response(status: int, body: bytes | str, *, source: str = "") -> ArbiterError:
    """The error an HTTP answer stands for, its message ``HTTP <status>[ from <source>]: …``."""
    where = f"HTTP {status} from {source}" if source else f"HTTP {status}"
    cls = error_class(status)
    try:
        envelope = ErrorResponse.model_validate_json(body)
    except ValueError:
        envelope = None
    if envelope is not None:
        e = envelope.error
        if e.code == NOT_CONFIGURED and cls is Unprocessable:
            cls = NotConfigured
        err = cls(f"{where}: {e.message}"[:MAX_MESSAGE_CHARS], param=e.param, code=e.code)
        err.type = e.type
    else:
        try:
            text = _body_message(json.loads(body))
        except ValueError:
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
        err = cls(f"{where}: {text.strip()[:500] or '(empty body)'}")
    err.status = status
    return err


def from_status(status: int, message: str) -> ArbiterError:
    """The error for a status raised without a body (e.g. Starlette's 404 and 405)."""
    return error_class(status)(message, status=status)


def to_envelope(exc: BaseException) -> tuple[int, ErrorResponse]:
    """The HTTP status and envelope a service answers for ``exc``: the one way out."""
    if isinstance(exc, ArbiterError):
        return exc.status, exc.envelope()
    body = ErrorBody(type="internal_error", message=f"{type(exc).__name__}: {exc}")
    return 500, ErrorResponse(error=body)


def _kind_message(exc: BaseException) -> tuple[ErrorKind, str]:
    if isinstance(exc, ArbiterError):
        return exc.kind, exc.message[:MAX_MESSAGE_CHARS]
    return "internal", f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE_CHARS]


def item_error(index: int, exc: BaseException) -> ItemError:
    """The error entry beside the null score of response ``index``: one item's way out."""
    kind, message = _kind_message(exc)
    return ItemError(index=index, kind=kind, message=message)


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One response's outcome inside a component: a score, or ``None`` and why.

    Verify's pool workers send these between processes; the judge adds its token counts
    and the verdict's details (``info``).
    """

    score: float | None
    kind: ErrorKind | None = None  # set exactly when score is None
    message: str = ""
    info: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def failed(
        cls, exc: BaseException, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> ItemResult:
        """The null result for an item whose scoring raised ``exc``."""
        kind, message = _kind_message(exc)
        return cls(None, kind, message, None, prompt_tokens, completion_tokens)

    def __reduce__(self) -> tuple[type[ItemResult], tuple[Any, ...]]:
        # Pickled as its field tuple: a third of the default (slots) cost between processes.
        return ItemResult, (
            self.score,
            self.kind,
            self.message,
            self.info,
            self.prompt_tokens,
            self.completion_tokens,
        )

    def error(self, index: int) -> ItemError | None:
        """The wire error entry for response ``index``, or None when it has a score."""
        if self.score is not None:
            return None
        return ItemError(index=index, kind=self.kind or "internal", message=self.message)
