"""The one retry policy of every caller of the gateway (``arbiter.client``, and through it the
trainer and the framework adapters): which failures are retried, how long to wait between
tries (exponential backoff with jitter, or the server's ``Retry-After``, a number of seconds
or an HTTP date), and how many tries in all."""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

__all__ = ["NO_RETRY", "RETRY_EXCEPTIONS", "RetryPolicy", "retry_after_seconds"]

# Failures of the connection itself: the gateway may be restarting. (Not UnsupportedProtocol
# or a bad URL: those never heal.)
RETRY_EXCEPTIONS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a retryable failure.

    The n-th retry (n = 0, 1, …) waits ``min(max_delay, base_delay·2ⁿ)`` scaled by a random
    factor in [0.5, 1] (jitter, so that many trainers restarting together do not retry in
    step), or the server's ``Retry-After`` when it sent one (capped at ``max_retry_after``).
    """

    attempts: int = 6  # tries in all, the first included; 1 = never retry
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(
                f"RetryPolicy.attempts must be >= 1 (1 = no retry), got {self.attempts}"
            )
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy delays must be >= 0")

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        step = min(self.max_delay, self.base_delay * 2.0**retry)
        return step * random.uniform(0.5, 1.0)


NO_RETRY = RetryPolicy(attempts=1)


def retry_after_seconds(r: httpx.Response) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date (RFC 9110 §10.2.3)."""
    value = r.headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
