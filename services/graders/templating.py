"""``{{ sample.* }}`` and ``{{ item.* }}`` templates, as OpenAI's graders write them.

A variable is ``namespace.path``: ``sample.output_text``, ``sample.output_json.answer``,
``item.reference_answer``, ``item.rows[0].name`` (JSON-path-like: dotted keys, ``[n]`` or
``.n`` for list indices). ``sample`` holds ``output_text`` (the response) and
``output_json`` (the response parsed, when it is JSON); ``item`` is the dataset row.
``check`` refuses what can never resolve (another namespace, a sample variable not
provided here) when a grader is loaded; ``render`` raises ``MissingVariable`` for an item
key the row lacks (the caller's data: a 422) and ``SampleParseError`` for an
``output_json`` path the response does not have (the response's failure).
"""

from __future__ import annotations

import json
import re
from typing import Any

VARIABLE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_STEP = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_\-]*|\d+)|\[(\d+)\]|\[\"([^\"]*)\"\]")
SAMPLE_VARIABLES = ("output_text", "output_json")


class TemplateError(ValueError):
    """A template that can never resolve: ``variable`` is the text inside the braces."""

    def __init__(self, variable: str, why: str):
        super().__init__(f"{{{{ {variable} }}}}: {why}")
        self.variable = variable


class MissingVariable(TemplateError):
    """An ``item`` variable the row does not have."""


class SampleParseError(TemplateError):
    """A ``sample.output_json`` variable the response does not provide (not JSON, or no
    such key)."""


def _steps(variable: str) -> list[str | int]:
    """``item.a[0].b`` -> ``["item", "a", 0, "b"]``; TemplateError when it does not parse."""
    out: list[str | int] = []
    pos = 0
    while pos < len(variable):
        m = _STEP.match(variable, pos)
        if m is None or m.end() == pos or (pos == 0 and variable.startswith(".")):
            raise TemplateError(variable, "not a variable (write namespace.key.key, or [n])")
        key, index, quoted = m.groups()
        if index is not None:
            out.append(int(index))
        elif quoted is not None:
            out.append(quoted)
        else:
            assert key is not None
            out.append(int(key) if key.isdigit() and out else key)
        pos = m.end()
    return out


def variables(template: str) -> list[str]:
    return VARIABLE.findall(template)


def check(template: str) -> None:
    """Refuse a variable that no row and no sample could resolve (TemplateError)."""
    for variable in variables(template):
        steps = _steps(variable)
        if steps[0] not in ("sample", "item"):
            raise TemplateError(variable, "the namespaces are 'sample' and 'item'")
        if steps[0] == "sample":
            if len(steps) < 2 or steps[1] not in SAMPLE_VARIABLES:
                raise TemplateError(variable, f"sample provides {', '.join(SAMPLE_VARIABLES)} here")
            if steps[1] == "output_text" and len(steps) > 2:
                raise TemplateError(variable, "sample.output_text is a string")


def _lookup(value: Any, steps: list[str | int], variable: str, error: type[TemplateError]) -> Any:
    for step in steps:
        if isinstance(value, dict) and isinstance(step, str) and step in value:
            value = value[step]
        elif isinstance(value, dict) and isinstance(step, int) and str(step) in value:
            value = value[str(step)]
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            raise error(variable, f"no {step!r} there")
    return value


def resolve(variable: str, sample: dict[str, Any], item: dict[str, Any]) -> Any:
    steps = _steps(variable)
    if steps[0] == "item":
        return _lookup(item, steps[1:], variable, MissingVariable)
    if steps[0] == "sample" and len(steps) > 1 and steps[1] == "output_json":
        if sample.get("output_json") is None:
            raise SampleParseError(variable, "the response is not JSON")
        return _lookup(sample["output_json"], steps[2:], variable, SampleParseError)
    return _lookup(sample, steps[1:], variable, TemplateError)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(template: str, sample: dict[str, Any], item: dict[str, Any]) -> str:
    """``template`` with every variable replaced: a string as it is, anything else as JSON."""
    return VARIABLE.sub(lambda m: _text(resolve(m.group(1), sample, item)), template)
