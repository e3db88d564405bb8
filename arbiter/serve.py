"""``arbiter serve NAME``: run one service under uvicorn, configured by its settings.

    arbiter serve verify                  # VERIFY_HOST, VERIFY_PORT, VERIFY_LOG_LEVEL, ...
    arbiter serve gateway --port 9000     # a flag overrides its setting

Settings come from the environment (each service's ``<NAME>_*`` variables, read by
services/<name>/settings.py); ``--host`` and ``--port`` override ``host`` and ``port``.
Logging is configured here, once, for the service's loggers and uvicorn's
(services/common/logs.py). The Dockerfile, docker-compose.yml, k8s/, ``arbiter up``, the
tests and the benchmarks all start services this way.

With ``--workers N`` (or ``<NAME>_PROCESSES=N``) above 1 the service runs as N event-loop
processes, each with its own listening socket bound to the same host:port with
``SO_REUSEPORT``: the kernel spreads new connections across them by a hash of the
connection, so every process takes its share even when a client opens only a few
connections. (uvicorn's own ``--workers`` shares one socket, and the process that is awake
accepts a burst of new connections: measured, the two connections of a benchmark landed on
one process about half the time.) This process starts them (spawn), forwards SIGTERM and
SIGINT to them, and waits; they get SIGTERM from the kernel if it dies, however it dies
(``PR_SET_PDEATHSIG``), and a child that exits on its own stops the others and this process,
so a supervisor sees the service fail as a whole. Each process has its own state: its
verify pool, its /metrics counts.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arbiter.services.common.settings import ServiceSettings

# Each name is a package arbiter.services.<name> with settings.get_settings() and
# app.create_app(); the order is the order ``arbiter up`` starts them in.
SERVICES = ("verify", "embedding", "judge", "sandbox", "envs", "gateway")

log = logging.getLogger("arbiter.serve")


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


def serve(
    name: str, host: str | None = None, port: int | None = None, workers: int | None = None
) -> int:
    """Run service ``name`` until SIGTERM/SIGINT. Returns the exit status.

    ``workers``: event-loop processes (default: the service's ``processes`` setting)."""
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
    processes = settings.processes if workers is None else workers
    if processes < 1:
        sys.stderr.write(f"arbiter serve {name}: --workers {processes}: at least 1\n")
        return 2
    # The app factory reads the same (cached) settings; host and port are uvicorn's alone.
    # uvicorn's other defaults stay: loop/http "auto" (uvloop and httptools, which the
    # `service` extra installs) and the 5 s keep-alive that the gateway's and the judge's
    # HTTP clients stay under (they close idle connections first).
    config: dict[str, Any] = {
        "app": f"arbiter.services.{name}.app:create_app",
        "factory": True,
        "host": settings.host if host is None else host,
        "port": settings.port if port is None else port,
        "lifespan": "on",  # a failed start-up (model load, bad recipes) stops the process
        "log_config": log_config(name, settings.log_level),
        "log_level": settings.log_level,
        "access_log": settings.access_log,
        # uvicorn's http "auto" protocol, answering a request it cannot parse (a NUL or DEL
        # byte in a header) with the error envelope instead of plain text
        "http": "arbiter.services.common.protocol:HTTPProtocol",
    }
    if processes == 1:
        uvicorn.run(**config)
        return 0
    return _serve_processes(name, processes, config)


def _reuseport_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port that other processes may bind too (SO_REUSEPORT).

    Not listening yet: uvicorn listens on it once the app's start-up has finished, so the
    kernel, which hands each new connection to one of the listening sockets, sends none to
    a process that is still starting."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _child(config: dict[str, Any], parent: int) -> None:
    """One event-loop process: its own socket, uvicorn serving the app on it."""
    import uvicorn

    from arbiter.supervise import die_with_parent

    die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return
    cfg = uvicorn.Config(**config)  # configures logging as uvicorn.run does
    try:
        sock = _reuseport_socket(cfg.host, cfg.port)
    except OSError as exc:
        logging.getLogger("uvicorn.error").error(
            "could not bind %s:%s: %s", cfg.host, cfg.port, exc
        )
        sys.exit(1)
    server = uvicorn.Server(cfg)
    server.run(sockets=[sock])
    if not server.started:  # a failed start-up (lifespan) is a failure, as under uvicorn.run
        sys.exit(3)


def _serve_processes(name: str, processes: int, config: dict[str, Any]) -> int:
    """Start ``processes`` children, forward SIGTERM/SIGINT to them, wait for them all.

    A child that exits while no signal came stops the rest: the service fails whole
    (exit status 1) rather than run with part of its processes."""
    import logging.config

    logging.config.dictConfig(config["log_config"])
    ctx = mp.get_context("spawn")
    children = [
        ctx.Process(target=_child, args=(config, os.getpid()), name=f"{name}-{i}", daemon=False)
        for i in range(processes)
    ]
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for child in children:
        child.start()
    if stopping:  # a signal came while they started
        forward(signal.SIGTERM, None)
    log.info(
        "%s: %d processes on %s:%s (SO_REUSEPORT), pids %s",
        name, processes, config["host"], config["port"], [c.pid for c in children],
    )  # fmt: skip
    status = 0
    running = list(children)
    while running:
        wait([c.sentinel for c in running])
        for child in [c for c in running if c.exitcode is not None]:
            running.remove(child)
            if not stopping:
                log.error(
                    "%s process %s exited (code %s); stopping the others",
                    name, child.pid, child.exitcode,
                )  # fmt: skip
                status = 1
                forward(signal.SIGTERM, None)
    return status
