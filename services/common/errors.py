"""A flat error hierarchy; each error knows its HTTP status and envelope type.

Outside calls are wrapped at one boundary and raised as one of these; the app-level
handlers in ``services.common.app`` turn them (and validation errors) into the one
envelope ``{"error": {"type", "message", "param", "code"}}``.
"""

from __future__ import annotations

from arbiter.proto.common import ErrorBody, ErrorResponse, ErrorType


class ArbiterError(Exception):
    status: int = 500
    type: ErrorType = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    @property
    def retryable(self) -> bool:
        return self.status in (429, 503, 504)

    def envelope(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorBody(type=self.type, message=self.message, param=self.param, code=self.code)
        )


class BadRequest(ArbiterError):
    status = 400
    type = "invalid_request_error"


class Unprocessable(ArbiterError):
    status = 422
    type = "invalid_request_error"


class PayloadTooLarge(ArbiterError):
    status = 413
    type = "payload_too_large"


class NotFound(ArbiterError):
    status = 404
    type = "not_found"


class RateLimited(ArbiterError):
    status = 429
    type = "rate_limited"


class Unavailable(ArbiterError):
    status = 503
    type = "unavailable"


class UpstreamTimeout(ArbiterError):
    status = 504
    type = "timeout"
