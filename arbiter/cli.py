"""``arbiter``: run the stack locally (``arbiter up``) and export the wire contract."""

from __future__ import annotations

import argparse
import logging
import sys


def _cmd_openapi(args: argparse.Namespace) -> int:
    from arbiter.openapi import export

    for path in export():
        print(f"wrote {path}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from arbiter.stack import up

    return up(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arbiter", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_openapi = sub.add_parser("openapi", help="write proto/openapi/<service>.json")
    p_openapi.set_defaults(func=_cmd_openapi)

    p_up = sub.add_parser("up", help="start Redis and every service locally, score a sample")
    p_up.add_argument("--gateway-port", type=int, default=8000)
    p_up.add_argument("--redis-port", type=int, default=6379)
    p_up.add_argument("--verify-port", type=int, default=8001)
    p_up.add_argument("--embedding-port", type=int, default=8002)
    p_up.add_argument("--judge-port", type=int, default=8003)
    p_up.add_argument("--no-embedding", action="store_true", help="don't start the embedder")
    p_up.add_argument(
        "--judge-base-url",
        default=None,
        help="OpenAI-compatible server (e.g. http://127.0.0.1:8010/v1); starts the judge",
    )
    p_up.add_argument("--judge-model", default=None, help="model name on that server")
    p_up.add_argument("--logs", default="runs/stack", help="folder for the services' logs")
    p_up.add_argument("--samples", type=int, default=4, help="GSM8K samples to score at start")
    p_up.add_argument("--data", default=None, help="GSM8K dir (default ../shared/data/gsm8k)")
    p_up.add_argument("--once", action="store_true", help="stop after scoring the samples")
    p_up.set_defaults(func=_cmd_up)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
