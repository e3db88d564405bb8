"""``arbiter score`` / ``recipes`` / ``health`` / ``--version`` against the real gateway."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from arbiter.cli import main
from arbiter.procs import free_port
from arbiter.stack import _plan
from tests.arbiter.integrations.conftest import score_requests
from tests.conftest import start_service

GOOD = "<think>9 + 9 = 18</think><answer>18</answer>"
BARE = "The answer is 18."


def group(i: int, **extra: Any) -> dict[str, Any]:
    wrong = f"<think>x</think><answer>{i}</answer>"
    return {"id": f"g{i}", "prompt": f"{i}: 9+9?", "reference": "18",
            "responses": [GOOD, BARE, wrong], **extra}  # fmt: skip


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def score(url: str, src: Path, out: Path, *extra: str) -> int:
    return main(["score", "--recipe", "gsm8k", "--input", str(src), "--output", str(out),
                 "--url", url, "--quiet", *extra])  # fmt: skip


def test_score_writes_every_group_and_a_summary(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "in.jsonl", [group(i) for i in range(5)])
    out = tmp_path / "out.jsonl"
    before = score_requests(gateway_url)
    assert score(gateway_url, src, out, "--batch", "2", "--concurrency", "2") == 0
    assert score_requests(gateway_url) - before == 3  # 5 groups in batches of 2
    rows = {r["id"]: r for r in read(out)}
    assert sorted(rows) == [f"g{i}" for i in range(5)]
    assert rows["g1"]["components"]["math_accuracy"] == [1.0, 1.0, 0.0]
    assert rows["g1"]["rewards"] == [1.5, 1.0, 0.5]
    assert rows["g1"]["recipe"] == "gsm8k" and rows["g1"]["fingerprint"].startswith("sha256:")
    summary = capsys.readouterr().err
    assert "groups scored                            5 (0 from an earlier run)" in summary
    # g18 is right in its third response: 6 of 15 math right
    assert "mean math_accuracy                       0.6667 (n=15)" in summary


def test_resume_skips_scored_ids_and_rescores_the_rest(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "in.jsonl", [group(i) for i in range(3)])
    out = tmp_path / "out.jsonl"
    assert score(gateway_url, src, out) == 0
    # The input grows, and the last run was interrupted mid-line: that group is scored again.
    write(src, [group(i) for i in range(5)])
    with out.open("a") as f:
        f.write('{"id": "g3", "rewa')
    before = score_requests(gateway_url)
    assert score(gateway_url, src, out, "--batch", "1") == 0
    assert score_requests(gateway_url) - before == 2  # g3 and g4 only
    ids = [r["id"] for r in read_valid(out)]
    assert sorted(ids) == [f"g{i}" for i in range(5)] and len(ids) == 5
    assert "5 (3 from an earlier run)" in capsys.readouterr().err


def read_valid(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_bad_lines_are_recorded_named_and_retried_next_time(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "in.jsonl", [
        group(0),
        "not json",  # line 2: not JSON at all
        {"prompt": "no responses"},  # line 3: a group must have responses
        {"responses": [GOOD], "reference": "18"},  # line 4: no id, named after its line
    ])  # fmt: skip
    out = tmp_path / "out.jsonl"
    assert score(gateway_url, src, out) == 1  # some groups failed
    rows = {r["id"]: r for r in read(out)}
    assert "error" not in rows["g0"] and "error" not in rows["line-4"]
    assert rows["line-2"]["error"]["type"] == "invalid_request_error"
    assert rows["line-3"]["error"]["message"].startswith("line 3: responses")
    assert "errors: request: invalid_request_error   2" in capsys.readouterr().err
    assert score(gateway_url, src, out) == 1  # the failed ones are tried again, and fail again
    assert len(read(out)) == 6


def test_unreachable_gateway_and_unknown_recipe_exit_with_a_message(
    gateway_url: str, tmp_path: Path
) -> None:
    src = write(tmp_path / "in.jsonl", [group(0)])
    with pytest.raises(SystemExit, match="not reached after 1 tries"):
        score(f"http://127.0.0.1:{free_port()}", src, tmp_path / "o.jsonl", "--retries", "0")
    with pytest.raises(SystemExit, match=r"recipe 'nope' is not on the gateway \(gsm8k, "):
        main(["score", "--recipe", "nope", "--input", str(src), "--output",
              str(tmp_path / "o.jsonl"), "--url", gateway_url])  # fmt: skip


@pytest.mark.parametrize("recipe", ["gsm8k-dj", "gsm8k-verifier", "inline"])
def test_a_recipe_the_gateway_cannot_serve_stops_at_start(
    gateway_url: str, tmp_path: Path, recipe: str
) -> None:
    """The session gateway has no judge: nothing is sent, nothing written, and the message
    says what is missing and how to add it (it used to finish with every reward null)."""
    if recipe == "inline":
        path = tmp_path / "judged.yaml"
        path.write_text("components: [{name: format}, {name: judge_quality}]\n")
        recipe = str(path)
    src = write(tmp_path / "in.jsonl", [group(i) for i in range(3)])
    out = tmp_path / "out.jsonl"
    before = score_requests(gateway_url)
    with pytest.raises(SystemExit) as info:
        main(["score", "--recipe", recipe, "--input", str(src), "--output", str(out),
              "--url", gateway_url, "--quiet"])  # fmt: skip
    message = str(info.value.code)
    assert message.startswith("arbiter score: recipe ") and "GATEWAY_JUDGE_URL" in message
    assert "--judge-base-url URL --judge-model NAME" in message
    assert not out.exists() or out.read_text() == ""
    assert score_requests(gateway_url) == before


def test_inline_recipe_from_a_file_and_rich_output(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "format-only.yaml"
    recipe.write_text("name: format-only\ncomponents:\n  - {name: format, weight: 2.0}\n")
    src = write(tmp_path / "in.jsonl", [group(0)])
    out = tmp_path / "out.jsonl"
    argv = ["score", "--recipe", str(recipe), "--input", str(src), "--output", str(out),
            "--url", gateway_url]  # fmt: skip
    assert main(argv) == 0
    (row,) = read(out)
    assert row["recipe"] == "format-only" and row["rewards"] == [2.0, 0.0, 2.0]
    err = capsys.readouterr().err
    assert "scoring groups" in err and "┃" in err  # rich's progress bar and table


def test_recipes_health_and_version(gateway_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "--url", gateway_url]) == 0
    text = capsys.readouterr().out
    assert "1·math_accuracy + 0.5·format" in text
    lines = {line.split()[0]: line for line in text.splitlines() if not line.startswith(" ")}
    assert lines["gsm8k"].endswith("  available")
    assert lines["gsm8k-dj"].endswith("NOT AVAILABLE")  # no judge on this gateway
    assert "--judge-base-url URL" in " ".join(text.split())  # why, and how to add it
    assert main(["recipes", "--url", gateway_url, "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["gsm8k"]["available"] is True and listed["gsm8k-verifier"]["available"] is False
    assert "judge_verifier" in listed["gsm8k-verifier"]["reason"]
    assert main(["health", "--url", gateway_url]) == 0
    assert f"{gateway_url}: ready" in capsys.readouterr().out
    assert main(["health", "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "unreachable" in capsys.readouterr().err
    version = subprocess.run([sys.executable, "-m", "arbiter.cli", "--version"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert version.stdout.strip() == "arbiter 0.1.0"


@pytest.mark.parametrize(
    ("host", "gateway_host"),
    [
        (None, None),  # default: the gateway's own setting (127.0.0.1 unless GATEWAY_HOST)
        ("0.0.0.0", "0.0.0.0"),  # reachable from other machines
    ],
)
def test_up_host_binds_only_the_gateway(
    tmp_path: Path, host: str | None, gateway_host: str | None
) -> None:
    args = argparse.Namespace(redis_port=free_port(), judge_base_url=None, judge_model=None,
                              no_embedding=True, host=host, verify_port=free_port(),
                              embedding_port=None, judge_port=None, sandbox_port=None,
                              no_sandbox=True, gateway_port=free_port())  # fmt: skip
    procs = {p.name: p for p in _plan(args, tmp_path)}
    assert procs["gateway"].env.get("GATEWAY_HOST") == gateway_host
    assert "VERIFY_HOST" not in procs["verify"].env  # internal services stay on loopback


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_says_how_far_it_got_and_resume_scores_every_id_once(
    gateway_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    n = 600
    src = write(tmp_path / "in.jsonl", [group(i) for i in range(n)])
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "arbiter.cli", "score", "--recipe", "gsm8k", "--input",
            str(src), "--output", str(out), "--url", gateway_url]  # fmt: skip
    # One group per request, one at a time: slow enough to be stopped part way.
    proc = subprocess.Popen([*argv, "--batch", "1", "--concurrency", "1"],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not out.exists() or out.read_text().count("\n") < 5:
        assert proc.poll() is None, "finished before it could be interrupted"
        time.sleep(0.05)
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130
    assert "Traceback" not in err
    scored = len(read_valid(out))
    assert 5 <= scored < n
    assert f"interrupted: {scored}/{n} groups scored; run the same command to resume" in err
    # Resume: the rest is scored, every id exactly once, and the progress counts the resumed.
    done = subprocess.run([*argv, "--batch", "50"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["id"] for r in read_valid(out)]
    assert sorted(ids) == sorted(f"g{i}" for i in range(n)) and len(ids) == n
    assert f"{n}/{n}" in done.stderr  # n/total, resumed groups included
    assert f"{n} ({scored} from an earlier run)" in done.stderr


# --- dataset rows (HumanEval, MBPP) through the code recipe: a real gateway and sandbox ---

RIGHT_ADD = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"
WRONG_ADD = "```python\ndef add(a, b):\n    return a * b\n```"
HUMANEVAL_ROW = {
    "task_id": "HumanEval/900",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    "    assert candidate(0, 7) == 7\n",
    "entry_point": "add",
}
MBPP_ROW = {
    "task_id": 901,
    "text": "Write a function to find the shared elements of two lists.",
    "code": "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))",
    "test_list": [
        "assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
        "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}


@pytest.fixture(scope="module")
def code_gateway(log_dir: Path, verify_url: str, redis_url: str) -> Any:
    """A gateway with a sandbox behind it (GATEWAY_SANDBOX_URL): the code recipes."""
    sandbox, sandbox_url = start_service("sandbox", log_dir, {"SANDBOX_WORKERS": "2"})
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url,
           "GATEWAY_SANDBOX_URL": sandbox_url}  # fmt: skip
    gateway, url = start_service("gateway", log_dir, env)
    yield url
    gateway.stop()
    sandbox.stop()


def test_humaneval_and_mbpp_rows_score_with_the_code_recipe(
    code_gateway: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        # a right and a wrong program for each shape: 1.0 and 0.0
        {**HUMANEVAL_ROW, "responses": [RIGHT_ADD, WRONG_ADD]},
        {**MBPP_ROW, "completions": [MBPP_ROW["code"], "def similar_elements(a, b):\n"
                                     "    return tuple(set(a) | set(b))"]},
        # a HumanEval row without the policy's responses: recorded, named, not sent
        {**HUMANEVAL_ROW, "task_id": "HumanEval/902"},
    ]  # fmt: skip
    src, out = write(tmp_path / "rows.jsonl", rows), tmp_path / "out.jsonl"
    code = main(["score", "--recipe", "code", "--input", str(src), "--output", str(out),
                 "--url", code_gateway, "--quiet"])  # fmt: skip
    assert code == 1, capsys.readouterr().err  # the row without responses failed
    got = {r["id"]: r for r in read(out)}
    assert got["HumanEval/900"]["rewards"] == [1.0, 0.0], got["HumanEval/900"]
    assert got["901"]["components"]["code_tests"] == [1.0, 0.0], got["901"]
    assert got["HumanEval/902"]["error"]["message"] == (
        "line 3: responses: missing: add the policy's responses to each row (or run --canonical)"
    )


def test_canonical_solutions_pass_their_own_tests(code_gateway: str, tmp_path: Path) -> None:
    # the dataset's own solutions (HumanEval: prompt + canonical_solution) under its tests
    src = write(tmp_path / "rows.jsonl", [HUMANEVAL_ROW, MBPP_ROW])
    out = tmp_path / "out.jsonl"
    code = main(["score", "--recipe", "code-all", "--canonical", "--input", str(src),
                 "--output", str(out), "--url", code_gateway, "--quiet"])  # fmt: skip
    assert code == 0
    assert {r["id"]: r["rewards"] for r in read(out)} == {"HumanEval/900": [1.0], "901": [1.0]}


def test_a_recipe_with_an_openai_grader_scores_from_a_file(
    gateway_url: str, tmp_path: Path
) -> None:
    # a string_check grader beside a built-in component (docs/services/graders.md)
    says_it = {
        "type": "string_check",
        "name": "says it",
        "operation": "ilike",
        "input": "{{ sample.output_text }}",
        "reference": "answer is {{ item.reference }}",
    }
    recipe = {"components": [{"name": "math_accuracy"},
                             {"name": "says_it", "weight": 0.5, "grader": says_it}]}  # fmt: skip
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    src, out = write(tmp_path / "in.jsonl", [group(1)]), tmp_path / "out.jsonl"
    assert score(gateway_url, src, out, "--recipe", str(path)) == 0
    row = read(out)[0]
    assert row["components"]["says_it"] == [0.0, 1.0, 0.0]  # only BARE says "answer is 18"
    assert row["rewards"] == [1.0, 1.5, 0.0]
