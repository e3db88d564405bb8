"""compose-test's environments check: episodes through the gateway's ``/ors`` on the stack
``docker compose up`` started (standard library only; run by tests/compose/run.sh).

    python3 tests/compose/check_envs.py GATEWAY_URL

A calculator episode (a tool call, then the right answer: reward 1.0, from the verify
container) and a python episode (``run`` in the sandbox container, reached over the
sandbox's network, then a wrong answer: reward 0.0). Exits non-zero with what went wrong.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

TASK = {"question": "Tom has 3 bags of 4 apples and eats 2. How many are left?", "answer": "10"}


def post(url: str, body: Any = None, sid: str | None = None) -> tuple[str, str]:
    """(content type, body text) of a POST; raises on an HTTP error."""
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"}
    if sid:
        headers["X-Session-ID"] = sid
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.headers.get("Content-Type", ""), resp.read().decode()


def end_json(sse: str) -> dict[str, Any]:
    data, event = [], ""
    for line in sse.splitlines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event in ("chunk", "end"):
            data.append(line[5:].removeprefix(" "))
    out: dict[str, Any] = json.loads("".join(data))
    return out


def episode(ors: str, env: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    _, created = post(f"{ors}/create_session")
    sid = created.split("event: task_id")[1].split("data:")[1].split()[0]
    post(f"{ors}/create", {"env_name": env, "task_spec": TASK}, sid)
    outs = []
    for call in calls:
        ctype, body = post(f"{ors}/{env}/call", call, sid)
        if not ctype.startswith("text/event-stream"):
            raise SystemExit(f"{env} {call['name']}: content type {ctype!r}, not SSE")
        outs.append(end_json(body))
    post(f"{ors}/delete", None, sid)
    return outs


def main(gateway: str) -> None:
    ors = gateway.rstrip("/") + "/ors"
    step, done = episode(
        ors,
        "calculator",
        [
            {"name": "calculate", "input": {"expression": "3 * 4 - 2"}},
            {"name": "submit", "input": {"answer": "10"}},
        ],
    )
    if "10" not in step["output"]["blocks"][0]["text"]:
        raise SystemExit(f"calculator: calculate(3 * 4 - 2) answered {step}")
    if done["output"]["reward"] != 1.0 or not done["output"]["finished"]:
        raise SystemExit(f"calculator: the right answer got {done}")
    ran, wrong = episode(
        ors,
        "python",
        [
            {"name": "run", "input": {"code": "print(3 * 4 - 2)"}},
            {"name": "submit", "input": {"answer": "11"}},
        ],
    )
    if "10" not in ran["output"]["blocks"][0]["text"]:
        raise SystemExit(f"python: run() in the sandbox answered {ran}")
    if wrong["output"]["reward"] != 0.0:
        raise SystemExit(f"python: a wrong answer got {wrong}")
    print("envs: calculator 1.0, python (sandbox) ran and scored 0.0 for a wrong answer")


if __name__ == "__main__":
    main(sys.argv[1])
