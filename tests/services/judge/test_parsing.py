"""Reading scores out of judge replies: real vLLM bodies (fixtures/, captured from the
tiny model by capture.py) and a table of reply texts a real judge writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from arbiter.errors import Unprocessable, from_response
from arbiter.services.judge.parsing import (
    JudgeReplyError,
    finish_reason,
    first_token_top_logprobs,
    label_probability,
    message_text,
    parse_quality,
    usage_tokens,
)
from arbiter.services.judge.settings import JudgeSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return record


def reference_p_yes(top: list[dict[str, Any]]) -> float | None:
    """Independent reference: sum exp(logprob) of the Yes/No spellings, then renormalise."""
    yes = sum(math.exp(e["logprob"]) for e in top if e["token"].strip().lower() == "yes")
    no = sum(math.exp(e["logprob"]) for e in top if e["token"].strip().lower() == "no")
    return None if yes + no == 0 else yes / (yes + no)


QUALITY_TEXT_CASES = [
    # (reply text, scale, expected overall or None for judge_parse_error)
    # the schema-constrained shape: compact JSON, all four keys
    ('{"correctness":4,"reasoning":3,"clarity":5,"overall":4}', 5, 4.0),
    # pretty JSON with prose around it
    ('Rating:\n{\n  "correctness": 2,\n  "overall": 2\n}\nThanks', 5, 2.0),
    # the first JSON object wins, a later one is ignored
    ('{"overall": 5} then {"overall": 1}', 5, 5.0),
    # fenced JSON, capitalised key, number as a string
    ('```json\n{"Overall": "3"}\n```', 5, 3.0),
    # "score" key when there is no "overall"
    ('{"score": 2}', 5, 2.0),
    # a "4/5" string value
    ('{"overall": "4/5"}', 5, 4.0),
    # plain text "Overall: N/5"
    ("Correctness: 5\nOverall: 4/5", 5, 4.0),
    # plain text "Score: N"
    ("The reasoning is fine. Score: 3", 5, 3.0),
    # "a score of N"
    ("I would give it a score of 5.", 5, 5.0),
    # rating 1 is a real score: it maps to 0.0 (not a failure)
    ("overall = 1", 5, 1.0),
    # a 10-point scale
    ('{"overall": 10}', 10, 10.0),
    # a fractional rating inside the range is kept
    ('{"overall": 3.5}', 5, 3.5),
    # thinking is stripped before parsing: its numbers do not count
    ('<think>maybe score: 1</think>{"overall": 5}', 5, 5.0),
    # thinking cut off by max_tokens: nothing to read
    ("<think>let me weigh the steps, score 2 or", 5, None),
    # out of range above
    ('{"overall": 7}', 5, None),
    # out of range below (0 is not on a 1..5 scale)
    ('{"overall": 0}', 5, None),
    # negative in text
    ("Overall: -1", 5, None),
    # a dimension out of range makes the whole reply suspect
    ('{"correctness": 9, "overall": 3}', 5, None),
    # a boolean is not a rating
    ('{"overall": true}', 5, None),
    # no number at all
    ("The answer looks good to me.", 5, None),
    # empty reply
    ("", 5, None),
]


@pytest.mark.parametrize(("text", "scale", "overall"), QUALITY_TEXT_CASES)
def test_parse_quality_texts(text: str, scale: int, overall: float | None) -> None:
    if overall is None:
        with pytest.raises(JudgeReplyError) as err:
            parse_quality(text, scale)
        assert err.value.kind == "judge_parse_error"
        return
    verdict = parse_quality(text, scale)
    assert verdict.overall == overall
    assert verdict.score == pytest.approx((overall - 1) / (scale - 1))
    assert 0.0 <= verdict.score <= 1.0


@pytest.mark.parametrize(
    ("text", "overall"),
    [
        ("overall: 1", None),  # cut where "overall: 10" may have gone on: no verdict
        ("Score: 4   \n", None),  # only whitespace after the number: still cut there
        ("Score: 4. The answer is right but the last step is", 4.0),  # the rating is whole
        ('{"overall": 2} and then the reasoning went on and on', 2.0),  # complete JSON
    ],
)
def test_a_reply_cut_at_max_tokens_right_after_its_rating_is_no_verdict(
    text: str, overall: float | None
) -> None:
    if overall is None:
        with pytest.raises(JudgeReplyError, match="cut at max_tokens"):
            parse_quality(text, 10, cut=True)
        assert parse_quality(text, 10).overall in (1.0, 4.0)  # uncut, the same text counts
        return
    assert parse_quality(text, 10, cut=True).overall == overall


def test_finish_reason_is_read_from_the_body() -> None:
    assert finish_reason(fixture("quality_text")["response"]) == "length"
    assert finish_reason({"choices": []}) is None and finish_reason({}) is None


def test_quality_real_json_schema_reply() -> None:
    # vLLM + xgrammar json_schema reply: the four ratings, each within 1..5
    body = fixture("quality_json_schema")["response"]
    text = message_text(body)
    verdict = parse_quality(text, 5)
    assert verdict.dimensions == {k: float(v) for k, v in json.loads(text).items()}
    assert verdict.score == (json.loads(text)["overall"] - 1) / 4
    assert usage_tokens(body) == (
        body["usage"]["prompt_tokens"],
        body["usage"]["completion_tokens"],
    )


def test_quality_real_unconstrained_reply_is_parse_error() -> None:
    # the random model without a grammar writes newlines until max_tokens: no score, not 0
    body = fixture("quality_text")["response"]
    assert body["choices"][0]["finish_reason"] == "length"
    with pytest.raises(JudgeReplyError) as err:
        parse_quality(message_text(body), 5)
    assert err.value.kind == "judge_parse_error"


def test_real_reply_without_logprobs_is_unsupported() -> None:
    # a real body that carries "logprobs": null, as from a server that ignores them
    body = fixture("quality_json_schema")["response"]
    assert body["choices"][0]["logprobs"] is None
    with pytest.raises(JudgeReplyError) as err:
        first_token_top_logprobs(body)
    assert err.value.kind == "judge_unsupported"


@pytest.mark.parametrize(
    ("name", "labelled"),
    [
        # whole vocabulary (trimmed to top 20 + every variant): " Yes", "Yes", " no", "No"...
        ("verifier_full_vocab", True),
        # structured_outputs choice: Yes/No plus prefixes "Y"/"N" and -9999 masked entries
        ("verifier_constrained", True),
        # top 20 of a random model: no label among them
        ("verifier_top20", False),
        # return_tokens_as_token_ids: tokens read "token_id:N", no text to match
        ("verifier_token_ids", False),
    ],
)
def test_label_probability_on_real_bodies(name: str, labelled: bool) -> None:
    body = fixture(name)["response"]
    top = first_token_top_logprobs(body)
    assert len(top) >= fixture(name)["request"]["top_logprobs"] or "_trimmed" in body
    expected = reference_p_yes(top) if name != "verifier_token_ids" else None
    if not labelled:
        assert expected is None
        with pytest.raises(JudgeReplyError) as err:
            label_probability(top)
        assert err.value.kind == "judge_no_label"
        return
    verdict = label_probability(top)
    assert expected is not None
    assert verdict.p_yes == pytest.approx(expected, abs=1e-12)
    assert 0.0 <= verdict.p_yes <= 1.0


def test_full_vocab_sums_spelling_variants() -> None:
    # both " Yes" and "Yes" are listed; p(Yes) is their sum
    top = first_token_top_logprobs(fixture("verifier_full_vocab")["response"])
    yes = [e["logprob"] for e in top if e["token"].strip().lower() == "yes"]
    assert len(yes) >= 2
    verdict = label_probability(top)
    assert verdict.logprob_yes == pytest.approx(math.log(sum(math.exp(v) for v in yes)))


def test_constrained_ignores_masked_and_prefix_tokens() -> None:
    top = first_token_top_logprobs(fixture("verifier_constrained")["response"])
    assert any(e["logprob"] <= -9999 for e in top)  # the grammar mask shows through
    assert {"Y", "N"} & {e["token"] for e in top}  # prefixes of the labels, not labels
    verdict = label_probability(top)
    yes = next(e["logprob"] for e in top if e["token"] == "Yes")
    no = next(e["logprob"] for e in top if e["token"] == "No")
    assert verdict.p_yes == pytest.approx(1 / (1 + math.exp(no - yes)))


def _e(token: str, logprob: float, raw: list[int] | None = None) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": raw}


SYNTHETIC_LABEL_CASES = [
    # (top entries, expected p(Yes) or None for judge_no_label)
    # only Yes listed: p = 1 (No is below the top-k)
    ([_e("Yes", -0.1), _e("Maybe", -2.0)], 1.0),
    # only a lower-case "no" listed: p = 0
    ([_e(" no", -0.3), _e("x", -1.0)], 0.0),
    # equal mass
    ([_e("Yes", -1.0), _e("No", -1.0)], 0.5),
    # upper case and newline-led spellings count
    ([_e("YES", math.log(0.3)), _e("\nNo", math.log(0.1))], 0.75),
    # an empty token text is read from its bytes
    ([_e("", math.log(0.2), [89, 101, 115]), _e("No", math.log(0.2))], 0.5),
    # two distinct tokens that display alike both count
    ([_e("Yes", math.log(0.1)), _e("Yes", math.log(0.1)), _e("No", math.log(0.2))], 0.5),
    # "Yes." is another word, not the label
    ([_e("Yes.", -0.1), _e("No", -3.0)], 0.0),
    # vLLM's grammar mask floor carries no probability
    ([_e("Yes", -9999.0), _e("No", -9999.0), _e("a", -1)], None),
    # nothing that reads as a label
    ([_e("Y", -0.1), _e("N", -0.2)], None),
    # very unequal log-probs do not overflow
    ([_e("Yes", -0.0), _e("No", -1000.0)], 1.0),
]


@pytest.mark.parametrize(("top", "p"), SYNTHETIC_LABEL_CASES)
def test_label_probability_table(top: list[dict[str, Any]], p: float | None) -> None:
    if p is None:
        with pytest.raises(JudgeReplyError) as err:
            label_probability(top)
        assert err.value.kind == "judge_no_label"
    else:
        assert label_probability(top).p_yes == pytest.approx(p)


def test_legacy_top_logprobs_map() -> None:
    # older servers send top_logprobs as {token: logprob}
    body = {"choices": [{"logprobs": {"content": [{"top_logprobs": {"Yes": -1.0, "No": -1.0}}]}}]}
    assert label_probability(first_token_top_logprobs(body)).p_yes == pytest.approx(0.5)


def test_upstream_error_from_real_400() -> None:
    # vLLM's own error body (not Arbiter's envelope): the message is still found, and a
    # 400 is the request's fault, so the judge does not retry it.
    rec = fixture("error_context_length")
    assert rec["status"] == 400
    err = from_response(400, json.dumps(rec["response"]))
    assert str(err).startswith("HTTP 400: This model's maximum context length")
    assert err.kind == "bad_response" and not err.retryable and not isinstance(err, Unprocessable)


def test_settings_fail_fast_and_hide_the_key() -> None:
    with pytest.raises(ValueError, match="must be an http"):
        JudgeSettings(base_url="127.0.0.1:8010/v1")
    s = JudgeSettings(base_url="http://h:1/v1/", api_key="sk-secret")
    assert s.base_url == "http://h:1/v1" and s.port == 8003
    assert "sk-secret" not in repr(s)
