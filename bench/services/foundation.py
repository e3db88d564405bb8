"""The services' first benchmark in one run on the same cores: (a) verify over HTTP vs in-process
math-verify in a 2-process pool, (b) gateway added latency vs calling verify directly,
(c) cached-hit throughput through the gateway with Redis.

    .venv/bin/python -m bench.services.foundation [--json results.json]

Run it on a quiet machine (``uptime`` is printed with the results): every process of
the stack shares the same cores, so other load distorts the ratios.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bench import record
from bench.services import gateway, verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--rounds", type=int, default=2, help="(a) rounds, best kept")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    a = verify.run(rounds=args.rounds)
    print("## (a) verify throughput\n" + verify.table(a) + "\n")
    bc = gateway.run()
    print("## (b) gateway added latency, (c) cached hits\n" + gateway.table(bc))
    if args.json:
        record.write_result(args.json, {"verify": a, "gateway": bc}, indent=2)


if __name__ == "__main__":
    main()
