"""No verify verdict that a deadline decided is a score: math-verify's own timeout (in the
worker, ``signal.alarm``) gives null ``timeout``, which is retryable and which the gateway
never caches (it writes only non-null scores); the pool's wall-clock deadline likewise
(``test_http.test_deadline``). A timeout is not remembered with the reference either: the
same reference is parsed afresh by the next item."""

from __future__ import annotations

from arbiter.services.verify.worker import score_item, score_response

# math-verify evaluates 7^123456789 when it compares: past a 1 s timeout.
HEAVY = "\\boxed{7^{123456789}}"


def test_a_comparison_cut_short_is_null_not_zero() -> None:
    result, path, _ = score_response(f"<answer>{HEAVY}</answer>", "5", 1e-6, 1)
    assert (result.score, result.kind, path) == (None, "timeout", "math_verify")


def test_a_timeout_on_one_part_is_null_even_when_the_rest_differ() -> None:
    # Several boxes: the set holds a part math-verify cannot decide in time.
    r = score_item("\\{5, 6\\}", f"\\boxed{{5}} and {HEAVY}", 1e-6, 1)
    assert (r.score, r.kind) == (None, "timeout"), r.message


def test_a_timeout_leaves_the_reference_usable() -> None:
    # One response's comparison times out; the next response against the same reference
    # is scored on its own (nothing about the timeout was kept with the reference).
    first, _, _ = score_response("<answer>5</answer>", HEAVY, 1e-6, 1)
    assert (first.score, first.kind) == (None, "timeout")
    again, _, _ = score_response(f"<answer>{HEAVY}</answer>", HEAVY, 1e-6, 1)
    assert (again.score, again.kind) == (1.0, None)


def test_plain_numbers_never_wait_on_math_verify() -> None:
    # Both sides plain numbers: an exact comparison, whatever the clock says.
    assert score_item("1000000", "1000001", 1e-6, 1).score == 0.0
