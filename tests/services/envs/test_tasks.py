"""Where tasks come from: GSM8K read at start-up, and a deployment without it."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.services.envs.conftest import Episodes, start_envs


def test_gsm8k_splits_are_the_files_rows(envs_url: str, gsm8k_dir: Path) -> None:
    rows = (gsm8k_dir / "test.jsonl").read_text().splitlines()
    tasks = httpx.post(f"{envs_url}/math/tasks", json={"split": "test"}, timeout=60).json()
    assert len(tasks["tasks"]) == len(rows)
    assert tasks["tasks"][0]["answer"].endswith("#### 18")


def test_without_gsm8k_the_math_envs_take_a_task_spec(
    log_dir: Path, state_redis: str, verify_url: str, tmp_path: Path
) -> None:
    proc, url = start_envs(
        log_dir, state_redis, verify_url, None, ARBITER_GSM8K_DIR=str(tmp_path / "none")
    )
    try:
        ready = httpx.get(f"{url}/readyz").json()
        assert ready["ready"] and ready["checks"]["gsm8k"].startswith("degraded: GSM8K not found")
        assert httpx.get(f"{url}/math/splits").json() == []
        e = Episodes(url)
        sid = e.create("math", task_spec={"question": "2+2?", "answer": "4"})
        done = e.call("math", sid, "submit", answer="<think>2+2</think><answer>4</answer>")
        assert done.result["output"]["reward"] == 1.5
    finally:
        proc.stop()


def test_index_routes_of_the_openreward_sdk(envs_url: str) -> None:
    n = httpx.post(f"{envs_url}/code/num_tasks", json={"split": "test"}).json()["num_tasks"]
    assert n == 11
    one = httpx.post(f"{envs_url}/code/task", json={"split": "test", "index": 5}).json()
    assert one["env_name"] == "code" and one["task"]["id"] == "Mbpp/2"
    last = httpx.post(f"{envs_url}/code/task_range", json={"split": "test", "start": -2}).json()
    assert [t["id"] for t in last["tasks"]] == ["Mbpp/126", "Mbpp/160"]
    past = httpx.post(f"{envs_url}/code/task", json={"split": "test", "index": 11})
    assert past.status_code == 400 and past.json()["error"]["param"] == "index"
