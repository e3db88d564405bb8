"""``arbiter serve NAME``: run one service under uvicorn, configured by its settings.

    arbiter serve verify                  # VERIFY_HOST, VERIFY_PORT, VERIFY_LOG_LEVEL, ...
    arbiter serve gateway --port 9000     # a flag overrides its setting

Settings come from the environment (each service's ``<NAME>_*`` variables, read by
services/<name>/settings.py); ``--host`` and ``--port`` override ``host`` and ``port``.
Logging is configured here, once, for the service's loggers and uvicorn's
(services/common/logs.py). The Dockerfile, docker-compose.yml, k8s/, ``arbiter up``, the
tests and the benchmarks all start services this way.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbiter.services.common.settings import ServiceSettings

# Each name is a package arbiter.services.<name> with settings.get_settings() and
# app.create_app(); the order is the order ``arbiter up`` starts them in.
SERVICES = ("verify", "embedding", "judge", "gateway")


def settings_class(name: str) -> type[ServiceSettings]:
    """The settings class of service ``name``: the one defined in its settings module."""
    from arbiter.services.common.settings import ServiceSettings

    module = importlib.import_module(f"arbiter.services.{name}.settings")
    (cls,) = (
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, ServiceSettings)
        and v.__module__ == module.__name__
    )
    return cls


def default_port(name: str) -> int:
    """The port service ``name`` binds unless told otherwise: its settings' default."""
    return int(settings_class(name).model_fields["port"].default)


def serve(name: str, host: str | None = None, port: int | None = None, workers: int = 1) -> int:
    """Run service ``name`` until SIGTERM/SIGINT. Returns the exit status."""
    import uvicorn
    from pydantic import ValidationError

    from arbiter.services.common.logs import log_config

    if name not in SERVICES:
        sys.stderr.write(f"arbiter serve: unknown service {name!r}; one of {SERVICES}\n")
        return 2
    module = importlib.import_module(f"arbiter.services.{name}.settings")
    try:
        settings: ServiceSettings = module.get_settings()
    except ValidationError as exc:  # a bad variable: say which, before anything starts
        prefix = str(settings_class(name).model_config.get("env_prefix", ""))
        problems = [
            f"  {(prefix + str(e['loc'][0])).upper() + ': ' if e['loc'] else ''}{e['msg']}"
            for e in exc.errors()
        ]
        sys.stderr.write(f"arbiter serve {name}: invalid settings\n" + "\n".join(problems) + "\n")
        return 2
    # The app factory reads the same (cached) settings; host and port are uvicorn's alone.
    # uvicorn's other defaults stay: loop/http "auto" (uvloop and httptools, which the
    # `service` extra installs) and the 5 s keep-alive that the gateway's and the judge's
    # HTTP clients stay under (they close idle connections first).
    uvicorn.run(
        f"arbiter.services.{name}.app:create_app",
        factory=True,
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
        workers=workers,
        lifespan="on",  # a failed start-up (model load, bad recipes) stops the process
        log_config=log_config(name, settings.log_level),
        log_level=settings.log_level,
        access_log=settings.access_log,
    )
    return 0
