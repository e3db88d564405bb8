"""One log format for every service, configured once by ``arbiter serve``.

Every record is one line on stderr::

    2026-11-26T08:40:35.123Z verify INFO arbiter.verify: verify ready: 2 workers, ...

UTC timestamp, service name, level, logger, message. A traceback stays in the same line
(its newlines written as ``\\n``), so a log collector never splits one event into several.
The service's own loggers (``arbiter.*``) and uvicorn's log at the service's level
(``<PREFIX>_LOG_LEVEL``); other libraries only at warning and above, so that a client
library's per-request info lines do not flood a busy service.
"""

from __future__ import annotations

import logging
import logging.config
import time
from typing import Any

# Loggers that follow the service's level; everything else propagates to the root logger,
# which is held at warning or above.
OWN_LOGGERS = ("arbiter", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class LineFormatter(logging.Formatter):
    """``<UTC time> <service> <LEVEL> <logger>: <message>``, one line per record."""

    def __init__(self, service: str) -> None:
        service = service.replace("%", "%%")
        super().__init__(fmt=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\\n")


def log_config(service: str, level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict (also uvicorn's ``log_config``) for ``service``."""
    own = level.upper()
    others = logging.getLevelName(max(logging.getLevelName(own), logging.WARNING))
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"line": {"()": LineFormatter, "service": service}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "line",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": others},
        "loggers": {
            name: {"handlers": [], "level": own, "propagate": True} for name in OWN_LOGGERS
        },
    }


def configure(service: str, level: str) -> None:
    """Apply the format outside uvicorn (a worker process, a script)."""
    logging.config.dictConfig(log_config(service, level))
