"""Every result file in bench/results/ says what ran it, and bench.record writes that header.

A figure in the docs quotes a file here; without the machine, the commit, the command, the
date and the versions a reader cannot tell what the number measured or re-run it. JSON files
carry a top-level ``"run"`` object; any other file a ``<name>.run.json`` sidecar.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import record

TOP = sorted(p for p in record.RESULTS.iterdir() if p.is_file())


def _run_of(path: Path) -> object:
    if path.suffix == ".json":
        return json.loads(path.read_text()).get("run")
    side = record.sidecar(path)
    assert side.is_file(), f"{path.name} is not JSON and has no {side.name} beside it"
    return json.loads(side.read_text()).get("run")


@pytest.mark.parametrize("path", TOP, ids=[p.name for p in TOP])
def test_every_result_file_names_what_ran_it(path: Path) -> None:
    assert record.missing(_run_of(path)) == [], f"{path.name}: header incomplete"


def test_no_sidecar_is_left_without_its_file() -> None:
    for side in record.RESULTS.glob(f"*{record.SIDECAR}"):
        assert side.with_name(side.name.removesuffix(record.SIDECAR)).is_file(), side.name


def test_write_result_puts_the_header_first_and_keeps_the_body(tmp_path: Path) -> None:
    body = {"machine": "the benchmark's own note", "ratio": 1.5, "rows": [1, 2]}
    out = tmp_path / "sub" / "r.json"
    record.write_result(out, body, command="python -m bench.x --json r.json")
    written = json.loads(out.read_text())
    assert next(iter(written)) == "run"
    assert {k: written[k] for k in body} == body
    run = written["run"]
    assert record.missing(run) == []
    assert run["command"] == "python -m bench.x --json r.json"
    assert run["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_the_command_defaults_to_this_process_command_line() -> None:
    assert record.header()["command"].split()[0] == sys.orig_argv[0]


def test_the_commit_comes_from_git_or_from_arbiter_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    head = record.commit()
    assert head and not head.startswith("unknown"), head  # this checkout is a git checkout
    monkeypatch.setenv("ARBITER_COMMIT", "abc1234")
    assert record.header()["commit"] == "abc1234"


def test_a_file_that_is_not_json_gets_a_sidecar(tmp_path: Path) -> None:
    data = tmp_path / "metrics.jsonl.gz"
    data.write_bytes(b"\x1f\x8b")
    side = record.write_sidecar(data, command="bash bench/device/x.sh")
    assert side == tmp_path / "metrics.jsonl.gz.run.json"
    assert record.missing(json.loads(side.read_text())["run"]) == []


@pytest.mark.parametrize(
    ("run", "gaps"),
    [
        (None, list(record.FIELDS)),  # no header at all
        # no versions
        ({"machine": "m", "commit": "c", "command": "x", "date": "d"}, ["versions"]),
        (  # an empty field
            {"machine": "", "commit": "c", "command": "x", "date": "d", "versions": {"p": "3"}},
            ["machine"],
        ),
        (  # a version left empty
            {"machine": "m", "commit": "c", "command": "x", "date": "d", "versions": {"p": ""}},
            ["versions (an empty value)"],
        ),
    ],
)
def test_an_incomplete_header_is_named(run: object, gaps: list[str]) -> None:
    assert record.missing(run) == gaps
