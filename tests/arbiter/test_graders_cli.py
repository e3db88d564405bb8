"""``arbiter graders validate FILE``: graders checked offline, each error naming its field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.cli import main

CHECK = {"type": "string_check", "name": "check", "input": "{{ sample.output_text }}",
         "reference": "{{ item.label }}", "operation": "eq"}  # fmt: skip
SIMILAR = {"type": "text_similarity", "name": "similar", "input": "{{ sample.output_text }}",
           "reference": "{{ item.label }}", "evaluation_metric": "bleu"}  # fmt: skip


def run(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["graders", "validate", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("one.json", json.dumps(CHECK)),  # one grader
        ("list.json", json.dumps([CHECK, SIMILAR])),  # a list
        ("lines.jsonl", f"{json.dumps(CHECK)}\n{json.dumps(SIMILAR)}\n"),  # JSON Lines
        ("graders.yaml", yaml.safe_dump({"graders": [CHECK, SIMILAR]})),  # YAML, under graders
        # an OpenAI fine-tuning job: its reinforcement grader
        ("job.json", json.dumps({"model": "o4-mini", "method": {"type": "reinforcement",
                                 "reinforcement": {"grader": CHECK}}})),
        # a gateway recipes file with a grader component
        ("recipes.yaml", yaml.safe_dump({"recipes": [{"name": "mine", "components": [
            {"name": "check", "grader": CHECK}]}]})),
    ],
)  # fmt: skip
def test_valid_files_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    code, out, err = run(path, capsys)
    assert code == 0 and not err, err
    assert out.startswith("ok"), out


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({**CHECK, "operation": "like_regex"}, "grader.operation"),
        ([CHECK, {**SIMILAR, "evaluation_metric": "meteor"}], "[1].evaluation_metric"),
        ({**CHECK, "input": "{{ output_text }}"}, "grader.input"),
        ({"recipes": [{"name": "r", "components": [{"name": "c", "grader": {"type": "x"}}]}]},
         "recipes[0].components.0.grader"),
    ],
)  # fmt: skip
def test_invalid_graders_fail_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, words: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    code, _, err = run(path, capsys)
    assert code == 1 and words in err, err
