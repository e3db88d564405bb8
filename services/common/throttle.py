"""Rate-limited warnings: a repeated warning is logged once per interval, with a count.

During an outage every call fails the same way: the gateway's fan-out logged 2,652
"component call failed" lines in a 5.4 s verify outage. ``ThrottledLog`` logs the first
warning of a key at once, counts the repeats inside ``interval_s``, and says how many it
held back - on the key's next line, or, when the repeats stop (the outage ended), in a
summary line at the end of the interval (scheduled on the running event loop)::

    component call failed: verify: http://127.0.0.1:8001 unreachable (...)
    component call failed: verify: ... (412 similar suppressed in the last 10 s)

The key is what makes two warnings "the same" (e.g. the component and the error kind):
different keys never hold each other back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

ExcInfo = BaseException | None


@dataclass
class _Window:
    start: float
    suppressed: int = 0
    last: str = ""  # the last message held back, for the summary line
    flush_scheduled: bool = False


class ThrottledLog:
    """``warning(key, msg, *args)``: at most one line per key per ``interval_s``."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self.max_keys = max_keys  # a key per component and kind: a few; bounded anyway
        self._windows: dict[Hashable, _Window] = {}

    def warning(self, key: Hashable, msg: str, *args: object, exc_info: ExcInfo = None) -> None:
        self.log(logging.WARNING, key, msg, *args, exc_info=exc_info)

    def error(self, key: Hashable, msg: str, *args: object, exc_info: ExcInfo = None) -> None:
        self.log(logging.ERROR, key, msg, *args, exc_info=exc_info)

    def log(
        self, level: int, key: Hashable, msg: str, *args: object, exc_info: ExcInfo = None
    ) -> None:
        """Log at ``level`` unless ``key`` was logged within the interval. ``exc_info``
        (an exception) goes with the line that is logged: a traceback per window, not per
        repeat."""
        if not self.logger.isEnabledFor(level):
            return
        now = self.clock()
        window = self._windows.get(key)
        if window is not None and now - window.start < self.interval_s:
            window.suppressed += 1
            window.last = msg % args if args else msg
            self._schedule_flush(level, key, window)
            return
        held = window.suppressed if window is not None else 0
        if len(self._windows) >= self.max_keys and key not in self._windows:
            self._windows.clear()
        self._windows[key] = _Window(start=now)
        if held:
            msg = f"{msg} ({held} similar suppressed in the last {self.interval_s:g} s)"
        self.logger.log(level, msg, *args, exc_info=exc_info)

    def _schedule_flush(self, level: int, key: Hashable, window: _Window) -> None:
        if window.flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a script, a test): the count rides on the key's next line
        window.flush_scheduled = True
        delay = max(0.0, window.start + self.interval_s - self.clock())
        loop.call_later(delay, self._flush, level, key, window)

    def _flush(self, level: int, key: Hashable, window: _Window) -> None:
        """End of a window with held-back repeats and no line since: report them now."""
        if self._windows.get(key) is not window or not window.suppressed:
            return
        self.logger.log(
            level,
            "%s (%d similar suppressed in the last %g s)",
            window.last,
            window.suppressed,
            self.interval_s,
        )
        # The summary opens a new window, so the next repeat is held back, not logged.
        self._windows[key] = _Window(start=self.clock())
