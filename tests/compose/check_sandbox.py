"""The sandbox's checks of `make compose-test` (tests/compose/run.sh): the `code` recipe
through the gateway into the sandbox container, as a newcomer's `docker compose up` runs it.
Standard library only, beside check.py (whose helpers it uses).

    python3 tests/compose/check_sandbox.py score URL          # right 1.0, wrong 0.0, hostile 0.0
    python3 tests/compose/check_sandbox.py kill URL -- CMD... # a sandbox killed mid-job

Each prints what it checked and exits non-zero with the reason on the first failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from check import CheckFailed, check, http, score

PROMPT = 'def add(a, b):\n    """Return the sum of a and b."""\n'
HUMANEVAL = json.dumps(
    {
        "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
        "    assert candidate(-4, 4) == 0\n",
        "entry_point": "add",
    }
)
ASSERTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(-1, 5) == 4"
STDIO = json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12\n"}])


def fenced(code: str, tag: str = "") -> str:
    """A response as a policy writes one: prose, then the program in a fenced block (a tag in
    a comment keeps each run's programs out of the gateway's cache where that matters)."""
    comment = f"# {tag}\n" if tag else ""
    return f"Here is my solution.\n\n```python\n{comment}{code}```\n"


RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
# Each hostile program defines a correct add only if it got out: 1.0 would be an escape;
# each scores 0.0 because what it tries fails inside the sandbox.
HOSTILE = {
    # Redis and the gateway are on the compose network; the sandbox has no network at all
    # (its own network namespace; the sandbox container is not even on Redis's network)
    "socket to redis:6379": (
        "import socket\nsocket.create_connection(('redis', 6379), timeout=3).close()\n" + RIGHT
    ),
    "socket to the gateway": (
        "import socket\nsocket.create_connection(('gateway', 8000), timeout=3).close()\n" + RIGHT
    ),
    # the container's processes (the service, with Docker's HOSTNAME and the SANDBOX_*
    # settings in their environment) are in another PID namespace: none is visible
    "another process's environment": (
        "import os\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        env = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'HOSTNAME=' in env or b'SANDBOX_' in env:\n"
        "        exec('def add(a, b):\\n    return a + b\\n')\n"
    ),
    # the service's own files: its package is installed in site-packages, hidden
    "the service's code": (
        "import glob\n"
        "if glob.glob('/usr/local/lib/python3*/*-packages/arbiter/services/sandbox/*.py'):\n"
        "    exec('def add(a, b):\\n    return a + b\\n')\n"
    ),
    # past the per-test deadline: killed, the test fails with 'timeout'
    "an infinite loop": "while True:\n    pass\n" + RIGHT,
}


def code_groups(tag: str = "") -> list[tuple[dict[str, Any], list[float]]]:
    """(group, the rewards `code` must give it): HumanEval-, MBPP- and stdin/stdout-shaped."""
    stdio_right = "a, b = map(int, input().split())\nprint(a + b)\n"
    stdio_wrong = "a, b = map(int, input().split())\nprint(a * b)\n"
    return [
        (
            {"id": "humaneval", "prompt": PROMPT, "reference": HUMANEVAL,
             "responses": [fenced(RIGHT, tag), fenced(WRONG, tag)]},
            [1.0, 0.0],
        ),
        (
            {"id": "asserts", "prompt": "Write add(a, b).", "reference": ASSERTS,
             "responses": [RIGHT, WRONG]},
            [1.0, 0.0],
        ),
        (
            {"id": "stdio", "prompt": "Print the sum of two integers.", "reference": STDIO,
             "responses": [fenced(stdio_right, tag), fenced(stdio_wrong, tag)]},
            [1.0, 0.0],
        ),
    ]  # fmt: skip


def score_code(url: str, groups: list[tuple[dict[str, Any], list[float]]]) -> dict[str, Any]:
    body = score(url, "code", [g for g, _ in groups])
    for got, (group, expected) in zip(body["groups"], groups, strict=True):
        check(
            got["rewards"] == expected and got["components"]["code_tests"] == expected,
            f"code {group['id']}: rewards {got['rewards']} != {expected}: {got}",
        )
    return body


def cmd_score(url: str) -> None:
    status, ready = http("GET", f"{url}/readyz")
    check(status == 200, f"/readyz: HTTP {status}: {ready}")
    body = score_code(url, code_groups())
    print(f"  code: HumanEval, asserts and stdin/stdout groups: right 1.0, wrong 0.0 "
          f"(sandbox CPU {body['usage'].get('sandbox_cpu_ms', '?')} ms)")  # fmt: skip
    names = list(HOSTILE)
    hostile = {"id": "hostile", "prompt": PROMPT, "reference": HUMANEVAL,
               "responses": [fenced(HOSTILE[n]) for n in names]}  # fmt: skip
    started = time.monotonic()
    got = score(url, "code", [hostile])["groups"][0]
    for name, reward in zip(names, got["rewards"], strict=True):
        check(reward == 0.0, f"hostile program ({name}) scored {reward}: {got}")
    print(f"  hostile programs scored 0.0 in {time.monotonic() - started:.1f} s: "
          f"{', '.join(names)}")  # fmt: skip
    # the stack is still healthy: the gateway ready, the sandbox scoring, math scoring
    status, ready = http("GET", f"{url}/readyz")
    check(status == 200, f"/readyz after the hostile programs: HTTP {status}: {ready}")
    score_code(url, code_groups(tag=uuid.uuid4().hex))
    gsm8k = [{"id": "m", "prompt": "1+1?", "reference": "2",
              "responses": ["<think>1+1</think><answer>2</answer>"]}]  # fmt: skip
    rewards = score(url, "gsm8k", gsm8k)["groups"][0]["rewards"]
    check(rewards == [1.5], f"gsm8k after the hostile programs: {rewards}")
    print("  after them: /readyz 200, code groups scored again (no cache), gsm8k 1.5")


def cmd_kill(url: str, during: list[str]) -> None:
    """A sandbox killed from outside while its program runs (as the OOM killer would): that
    response is null (sandbox_error, counted in sandbox_failures_total), the next scores."""
    slow = "import time\ndef add(a, b):\n    time.sleep(4)\n    return a + b\n"
    group = {"id": "killed", "prompt": PROMPT, "reference": HUMANEVAL,
             "responses": [fenced(slow, uuid.uuid4().hex)]}  # fmt: skip
    out: dict[str, Any] = {}

    def client() -> None:
        out["body"] = score(url, "code", [group])

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(1.5)  # the program is in its sleep
    subprocess.run(during, check=True, timeout=60)
    thread.join(timeout=60)
    check("body" in out, "the killed job's request got no answer")
    got = out["body"]["groups"][0]
    kinds = [e["kind"] for e in got["errors"]]
    check(got["rewards"] == [None] and kinds == ["sandbox_error"], f"killed sandbox: {got}")
    score_code(url, code_groups(tag=uuid.uuid4().hex))
    print("  a sandbox killed mid-job: its response null (sandbox_error); the next scored")


# Run inside the sandbox container (docker compose exec -T sandbox python -c ...): SIGKILL
# every sandbox's harness (its command line: python3 -I -S -c HARNESS), idle or running.
KILL_HARNESSES = """
import os, signal
n = 0
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if argv[1:4] == [b'-I', b'-S', b'-c']:
        os.kill(int(pid), signal.SIGKILL)
        n += 1
print(f'  killed {n} sandboxes')
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("score")
    p.add_argument("url")
    p = sub.add_parser("kill")
    p.add_argument("url")
    p.add_argument("during", nargs="+")
    p = sub.add_parser("kill-script")  # prints KILL_HARNESSES, for run.sh
    args = parser.parse_args()
    try:
        if args.cmd == "score":
            cmd_score(args.url)
        elif args.cmd == "kill":
            cmd_kill(args.url, args.during)
        else:
            print(KILL_HARNESSES)
    except CheckFailed as err:
        print(f"FAILED: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
