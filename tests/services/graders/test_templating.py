"""{{ sample.* }} / {{ item.* }} templates: what resolves, what is refused and whose fault."""

from __future__ import annotations

import pytest

from arbiter.services.graders.templating import (
    MissingVariable,
    SampleParseError,
    TemplateError,
    check,
    render,
)

SAMPLE = {"output_text": '{"answer": 42, "steps": ["a", "b"]}',
          "output_json": {"answer": 42, "steps": ["a", "b"]}}  # fmt: skip
ITEM = {"reference_answer": "42", "rows": [{"name": "x"}], "n": 3, "nested": {"k": "v"}}


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ("{{ sample.output_text }}", SAMPLE["output_text"]),  # the response as it is
        ("{{sample.output_json.answer}}", "42"),  # a number, as JSON; spaces optional
        ("{{ sample.output_json.steps[1] }}", "b"),  # a list index
        ("{{ sample.output_json.steps.0 }}", "a"),  # the dotted index form
        ("{{ item.reference_answer }}!", "42!"),  # text around it kept
        ("{{ item.rows[0].name }}", "x"),
        ("{{ item.nested }}", '{"k": "v"}'),  # an object, as JSON
        ('{{ item["reference_answer"] }}', "42"),  # a quoted key
        ("no variables", "no variables"),
    ],
)
def test_variables_resolve(template: str, text: str) -> None:
    check(template)
    assert render(template, SAMPLE, ITEM) == text


@pytest.mark.parametrize(
    "template",
    [
        "{{ row.x }}",  # only sample and item
        "{{ sample.output_tools }}",  # not provided here
        "{{ sample.output_text.x }}",  # a string has no keys
        "{{ item..x }}",  # not a path
    ],
)
def test_variables_no_row_can_resolve_are_refused_when_loaded(template: str) -> None:
    with pytest.raises(TemplateError):
        check(template)


def test_an_item_key_the_row_lacks_is_the_callers_missing_variable() -> None:
    with pytest.raises(MissingVariable, match=r"item\.label"):
        render("{{ item.label }}", SAMPLE, ITEM)


def test_json_the_response_does_not_have_is_the_responses_parse_error() -> None:
    not_json = {"output_text": "hello", "output_json": None}
    with pytest.raises(SampleParseError):
        render("{{ sample.output_json.answer }}", not_json, ITEM)
    with pytest.raises(SampleParseError):
        render("{{ sample.output_json.missing }}", SAMPLE, ITEM)
