"""Agreement with the field's own code suites: every HumanEval problem and the MBPP
sanitized set through a running sandbox service, each response's score against what the
suite's own harness says (``suite_rows``: canonical 1.0, a mechanical bug and ``return
None`` their share of the real tests, body-only and fenced-with-example completions 1.0).

    .venv/bin/python -m bench.services.suites --humaneval HumanEval.jsonl.gz \\
        --mbpp sanitized-mbpp.json [--json bench/results/suites.json]

Data (not checked in): ``HumanEval.jsonl.gz`` from github.com/openai/human-eval
(``data/``, MIT); ``sanitized-mbpp.json`` from github.com/google-research/google-research
(``mbpp/``, CC-BY-4.0). The reference verdicts take minutes (mutants that loop run to
their limit): ``--rows`` keeps them in a file for the next run.

``sample`` writes the rows the tests check in (``tests/services/sandbox/suites/``)::

    .venv/bin/python -m bench.services.suites sample --humaneval ... --mbpp ...
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from arbiter.procs import free_port, service_process
from arbiter.proto.sandbox import CodeTestsParams
from arbiter.services.sandbox.settings import SandboxSettings
from bench import record
from bench.services import suite_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests/services/sandbox/suites"
# The checked-in sample: what each row covers (the test prints it with a failure).
HUMANEVAL_SAMPLE = {
    "HumanEval/0": "nested loops, a float threshold",
    "HumanEval/2": "float result compared within 1e-6",
    "HumanEval/4": "float tolerance on a mean",
    "HumanEval/12": "candidate([]) == None: return None passes one test of three",
    "HumanEval/32": "prompt defines poly; check calls it and loops 100 random cases",
    "HumanEval/38": "prompt defines encode_cyclic; check calls it in a loop",
    "HumanEval/44": "check is one for loop of asserts: a single test",
    "HumanEval/50": "prompt defines encode_shift; check imports random and string",
    "HumanEval/52": "assert not candidate(...): None passes those",
    "HumanEval/53": "a loop of random asserts after a plain block",
    "HumanEval/56": "bracket checks; assert not passes for None",
    "HumanEval/64": "FIX constant in the prompt, assert True lines in check",
    "HumanEval/86": "assert True lines; string result",
    "HumanEval/90": "None expected by three asserts, assert True lines",
    "HumanEval/107": "tuple results",
    "HumanEval/128": "candidate([]) == None, assert True lines",
    "HumanEval/137": "None expected by one assert, assert True lines",
    "HumanEval/151": "setup assignments inside check between asserts",
    "HumanEval/160": "assert True lines; arithmetic expression evaluation",
    "HumanEval/162": "candidate('') == None, imports hashlib",
}
MBPP_SAMPLE = {
    "Mbpp/2": "set(...) == set(...) comparisons",
    "Mbpp/3": "plain asserts on a bool",
    "Mbpp/7": "set comparisons of word lists",
    "Mbpp/82": "test_imports: math; math.isclose with rel_tol",
    "Mbpp/98": "test_imports: math; math.isclose",
    "Mbpp/111": "set comparisons on a nested list",
    "Mbpp/124": "test_imports: math; math.isclose on a complex angle",
    "Mbpp/126": "the solution is named sum: the asserts' sum(...) is the program's",
    "Mbpp/160": "assert f(...) == None: return None passes one",
    "Mbpp/163": "test_imports: math; math.isclose",
    "Mbpp/233": "test_imports: math; math.isclose",
    "Mbpp/395": "== None expected once",
    "Mbpp/431": "== None expected once",
    "Mbpp/596": "the asserts use sys, which only the solution imports (no test_imports)",
    "Mbpp/620": "a bug that passes two of three",
    "Mbpp/737": "== None expected once, regular expressions",
    "Mbpp/755": "== None expected twice of four",
    "Mbpp/773": "== None expected once of four",
    "Mbpp/787": "== None expected twice of four",
    "Mbpp/794": "== None expected twice of three",
    "Mbpp/803": "assert not f(...): None passes three of six",
    "Mbpp/804": "== None expected once",
}


def load_rows(humaneval: Path, mbpp: Path, only: set[str] | None = None) -> dict[str, Any]:
    he = [r for r in suite_rows.humaneval(humaneval) if only is None or r["task_id"] in only]
    mb = [r for r in suite_rows.mbpp(mbpp) if only is None or f"Mbpp/{r['task_id']}" in only]
    return {
        "humaneval": suite_rows.build(he, suite_rows.humaneval_row),
        "mbpp": suite_rows.build(mb, suite_rows.mbpp_row),
    }


def write_sample(humaneval: Path, mbpp: Path, out: Path) -> None:
    covers = {**HUMANEVAL_SAMPLE, **MBPP_SAMPLE}
    rows = load_rows(humaneval, mbpp, set(covers))
    for suite, suite_rows_ in rows.items():
        with (out / f"{suite}.jsonl").open("w") as f:
            for row in suite_rows_:
                f.write(json.dumps({**row, "covers": covers[row["id"]]}) + "\n")


# ------------------------------------------------------------------ the service


async def score_all(url: str, rows: list[dict[str, Any]], clients: int) -> list[dict[str, Any]]:
    """Each row as one group (all its responses), mode fraction; the answers in order."""
    answers: list[dict[str, Any]] = [{} for _ in rows]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(rows)):
        queue.put_nowait(i)

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            row = rows[i]
            group = {
                "id": row["id"],
                "prompt": row["prompt"],
                "reference": row["reference"],
                "responses": [c["response"] for c in row["cases"]],
            }
            body = {"groups": [group], "params": {"mode": "fraction"}}
            async with session.post(f"{url}/v1/code_tests", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
            answers[i] = answer["groups"][0]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return answers


def agreement(rows: list[dict[str, Any]], answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of response: how many scores equal the careful grader's (and each that does
    not), how many counts of tests equal the number of real tests; for bugs, also whether
    ``score < 1`` agrees with the suite harness's verdict."""
    table: dict[str, Any] = {}
    for row, got in zip(rows, answers, strict=True):
        for j, case in enumerate(row["cases"]):
            entry = table.setdefault(
                case["kind"], {"n": 0, "agree": 0, "tests_agree": 0, "disagree": []}
            )
            entry["n"] += 1
            score = got["scores"][j]
            # the count of tests: the real ones, as the reference counts them
            counted = (got["info"].get("tests") or [None] * (j + 1))[j]
            entry["tests_agree"] += counted == case["tests"]
            expected = case["expected"]
            if score is not None and expected is not None and abs(score - expected) < 1e-9:
                entry["agree"] += 1
            else:
                error = next((e for e in got["errors"] if e.get("index") == j), None)
                failed = (got["info"].get("failed") or [{}] * (j + 1))[j]
                entry["disagree"].append(
                    {
                        "id": row["id"],
                        "expected": expected,
                        "score": score,
                        "error": error,
                        "first_failure": next(iter(failed.values()), None) if failed else None,
                    }
                )
            if case["kind"] == "bug":
                harness_failed = case["verdict"] != "passed"
                same = score is not None and (score < 1.0) == harness_failed
                entry["verdict_agree"] = entry.get("verdict_agree", 0) + same
    return table


def header(command: str, humaneval: Path, mbpp: Path, workers: int) -> dict[str, Any]:
    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    python = SandboxSettings().python
    sandbox_python = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "bench": command,
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}",
        "load_average_before": os.getloadavg(),
        "versions": {
            "python": platform.python_version(),
            "sandbox_python": f"{python} {sandbox_python}",
        },
        "sandbox": {
            "workers": workers,
            "SANDBOX_TEST_TIMEOUT_S": SandboxSettings().test_timeout_s,
            "params": {"mode": "fraction", "timeout_s": CodeTestsParams().timeout_s},
        },
        "data": {
            "humaneval": {"file": humaneval.name, "sha256": sha(humaneval)},
            "mbpp": {"file": mbpp.name, "sha256": sha(mbpp)},
        },
        "reference": "bench.services.suite_check, plain python, per test; "
        f"{suite_rows.CANONICAL_TIMEOUT_S:g} s a test of a canonical solution, "
        f"{suite_rows.TEST_TIMEOUT_S:g} s of a mutant",
    }


async def run(rows: dict[str, Any], workers: int, clients: int) -> dict[str, Any]:
    port = free_port()
    env = {"SANDBOX_WORKERS": str(workers), "SANDBOX_LOG_LEVEL": "warning"}
    proc = service_process("sandbox", port, env=env)
    proc.start()
    proc.wait_ready(60)
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    try:
        for suite, suite_rows_ in rows.items():
            start = time.perf_counter()
            answers = await score_all(url, suite_rows_, clients)
            table = agreement(suite_rows_, answers)
            out[suite] = {"problems": len(suite_rows_), "wall_s": time.perf_counter() - start}
            out[suite]["kinds"] = table
            for kind, entry in table.items():
                extra = f", verdicts {entry['verdict_agree']}" if "verdict_agree" in entry else ""
                print(
                    f"{suite:10s} {kind:15s} {entry['agree']:4d}/{entry['n']}, "
                    f"tests counted {entry['tests_agree']}{extra}",
                    flush=True,
                )
    finally:
        proc.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=["table", "sample"], default="table")
    parser.add_argument("--humaneval", type=Path, required=True, help="HumanEval.jsonl.gz")
    parser.add_argument("--mbpp", type=Path, required=True, help="sanitized-mbpp.json")
    parser.add_argument("--rows", type=Path, help="keep the reference verdicts in this file")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clients", type=int, default=4, help="requests in flight")
    parser.add_argument("--json", type=Path, help="write the table here")
    args = parser.parse_args()
    if args.what == "sample":
        write_sample(args.humaneval, args.mbpp, SAMPLE)
        return
    command = "python -m bench.services.suites " + " ".join(sys.argv[1:])
    head = header(command, args.humaneval, args.mbpp, args.workers)
    if args.rows and args.rows.exists():
        rows = json.loads(args.rows.read_text())
    else:
        rows = load_rows(args.humaneval, args.mbpp)
        if args.rows:
            args.rows.write_text(json.dumps(rows))
    table = asyncio.run(run(rows, args.workers, args.clients))
    if args.json:
        record.write_result(args.json, {**head, **table}, indent=2)


if __name__ == "__main__":
    main()
