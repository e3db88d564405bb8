"""A sid deleted and opened again while a call on its first episode is still running,
against the real envs service and sandbox.

Guarded: the late call's save is refused (409 ``session_busy``, in its stream: the stream
had begun) instead of writing the
deleted episode (its task, its cells) over the new one: an episode opened on a split's
task stays on that task, never on one whose answer the caller chose.
"""

from __future__ import annotations

import threading
import time

import httpx

from tests.services.envs.conftest import Episodes, parse_sse, sse_error

OWN = {"question": "What is 1 + 1? (my own task)", "answer": "#### 2"}


def test_a_late_call_does_not_overwrite_a_reopened_sid(episodes: Episodes) -> None:
    sid = episodes.create("python", task_spec=OWN)
    late: list[httpx.Response] = []
    run = threading.Thread(
        target=lambda: late.append(
            episodes.call_raw("python", sid, "run", code="import time\ntime.sleep(2)\nx = 1")
        )
    )
    run.start()
    time.sleep(0.7)  # the run is in the sandbox (it sleeps 2 s)
    r = episodes.http.post(f"{episodes.url}/delete", headers=episodes.headers(sid))
    assert r.status_code == 200, r.text
    body = {"env_name": "python", "split": "test", "index": 0}
    r = episodes.http.post(f"{episodes.url}/create", json=body, headers=episodes.headers(sid))
    assert r.status_code == 200, r.text
    run.join(timeout=60)
    assert late and late[0].status_code == 200, late[0].text if late else "no answer"
    status, envelope = sse_error(late[0].text)
    assert status == 409 and envelope["error"]["code"] == "session_busy", late[0].text
    assert [e for e, _ in parse_sse(late[0].text)] == ["task_id", "error"]
    prompt = episodes.prompt("python", sid).json()[0]["text"]
    assert "my own task" not in prompt
    # the reopened episode has no cell of the deleted one
    out = episodes.call("python", sid, "run", code="print('x' in dir())")
    assert out.result["output"]["blocks"][0]["text"].strip() == "False"
