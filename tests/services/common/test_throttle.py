"""ThrottledLog: one line per key per interval, a count of what was held back."""

from __future__ import annotations

import asyncio
import logging

import pytest

from arbiter.services.common.throttle import ThrottledLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_repeats_are_counted_and_reported_on_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    logger = logging.getLogger("test.throttle.next")
    throttled = ThrottledLog(logger, interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for i in range(2652):  # a 5 s outage under load: one warning per failed call
            clock.now = i * 0.002  # 5.3 s
            throttled.warning(("verify", "unavailable"), "component call failed: %d", i)
        throttled.warning(("judge", "timeout"), "judge call failed")  # another key: logged
        clock.now = 10.5
        throttled.warning(("verify", "unavailable"), "component call failed: again")
    assert _messages(caplog) == [
        "component call failed: 0",
        "judge call failed",
        "component call failed: again (2651 similar suppressed in the last 10 s)",
    ]


def test_a_quiet_end_still_reports_the_count(caplog: pytest.LogCaptureFixture) -> None:
    # The outage ends: no next line comes, so the count is logged when the window closes.
    logger = logging.getLogger("test.throttle.flush")
    throttled = ThrottledLog(logger, interval_s=0.2)

    async def outage() -> None:
        for i in range(50):
            throttled.warning("k", "call failed: %d", i)
        await asyncio.sleep(0.4)

    with caplog.at_level(logging.WARNING, logger=logger.name):
        asyncio.run(outage())
    assert _messages(caplog) == [
        "call failed: 0",
        "call failed: 49 (49 similar suppressed in the last 0.2 s)",
    ]


def test_the_logged_line_carries_the_traceback_repeats_do_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    logger = logging.getLogger("test.throttle.exc")
    throttled = ThrottledLog(logger, interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for i in range(50):  # a bug hit by every request
            clock.now = i * 0.1
            throttled.error("bug", "unhandled error", exc_info=RuntimeError(f"boom {i}"))
    assert _messages(caplog) == ["unhandled error"]
    exc_info = caplog.records[0].exc_info
    assert exc_info is not None and str(exc_info[1]) == "boom 0"
