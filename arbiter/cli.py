"""``arbiter``: serve one service (``arbiter serve``), run the stack locally (``arbiter up``),
score a file (``arbiter score``), ask the gateway (``recipes``, ``health``), check OpenAI
graders offline (``graders validate``) and export the wire contract."""

from __future__ import annotations

import argparse
import logging
import sys


def _cmd_openapi(args: argparse.Namespace) -> int:
    from arbiter.openapi import export

    for path in export():
        print(f"wrote {path}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from arbiter.serve import serve

    return serve(args.service, host=args.host, port=args.port, workers=args.workers)


def _cmd_up(args: argparse.Namespace) -> int:
    from arbiter.stack import up

    return up(args)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("arbiter-rewards")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    from arbiter.score_cli import add_commands

    parser = argparse.ArgumentParser(prog="arbiter", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)  # score, recipes, health
    from arbiter.keys import add_commands as add_keys

    add_keys(sub)  # keys create|list|revoke
    from arbiter.graders_cli import add_commands as add_graders

    add_graders(sub)  # graders validate

    p_openapi = sub.add_parser("openapi", help="write proto/openapi/<service>.json")
    p_openapi.set_defaults(func=_cmd_openapi)

    from arbiter.serve import SERVICES

    p_serve = sub.add_parser(
        "serve", help="run one service (settings from the environment; flags override)"
    )
    p_serve.add_argument("service", choices=SERVICES)
    p_serve.add_argument("--host", default=None, help="bind address (default: <NAME>_HOST)")
    p_serve.add_argument("--port", type=int, default=None, help="port (default: <NAME>_PORT)")
    p_serve.add_argument(
        "--workers", type=int, default=None,
        help="event-loop processes on the one port (default: <NAME>_PROCESSES)",
    )  # fmt: skip
    p_serve.set_defaults(func=_cmd_serve)

    p_up = sub.add_parser("up", help="start Redis and every service locally, score a sample")
    p_up.add_argument(
        "--port-base", type=int, default=None, metavar="N",
        help="gateway on N, verify N+1, embedding N+2, judge N+3, sandbox N+4, Redis N+5, "
        "state Redis N+6 (default: $ARBITER_PORT_BASE; unset: each service's port setting, "
        "Redis 6379 and 6380); "
        "a single port flag still wins",
    )  # fmt: skip
    p_up.add_argument("--redis-port", type=int, default=None, help="default: 6379")
    p_up.add_argument(
        "--state-redis-port", type=int, default=None,
        help="the state Redis (ledger, quotas, idempotency keys; noeviction); default: 6380",
    )  # fmt: skip
    p_up.add_argument(
        "--host", default=None, help="the gateway's bind address (default: GATEWAY_HOST, "
        "127.0.0.1; 0.0.0.0 to reach it from other machines); the rest stay on 127.0.0.1",
    )  # fmt: skip
    for name in SERVICES:
        p_up.add_argument(f"--{name}-port", type=int, default=None, help="default: its setting")
    p_up.add_argument("--no-embedding", action="store_true", help="don't start the embedder")
    p_up.add_argument(
        "--no-sandbox", action="store_true",
        help="don't start the sandbox (recipes code, code-all: not configured)",
    )  # fmt: skip
    p_up.add_argument(
        "--judge-base-url",
        default=None,
        help="OpenAI-compatible server (e.g. http://127.0.0.1:8010/v1); starts the judge",
    )
    p_up.add_argument("--judge-model", default=None, help="model name on that server")
    p_up.add_argument("--logs", default="runs/stack", help="folder for the services' logs")
    p_up.add_argument("--samples", type=int, default=4, help="GSM8K samples to score at start")
    p_up.add_argument(
        "--data", default=None,
        help="GSM8K dir (default: $ARBITER_GSM8K_DIR, else ../shared/data/gsm8k beside the repo)",
    )  # fmt: skip
    p_up.add_argument("--once", action="store_true", help="stop after scoring the samples")
    p_up.add_argument(
        "--keys", default=None, metavar="FILE", help="turn auth on with this keys file "
        "(`arbiter keys create`; GATEWAY_KEY_SECRET from the env); default: no auth",
    )  # fmt: skip
    p_up.set_defaults(func=_cmd_up)

    args = parser.parse_args(argv)
    if args.func is _cmd_serve:
        return int(args.func(args))  # serve configures logging itself
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
