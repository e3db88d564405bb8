"""The ``format`` component: is the response ``<think>…</think><answer>…</answer>``?

Tags are found with one linear ``re.finditer`` over the exact tags (case-sensitive, no
attributes, content may span lines), so a 100,000-character response costs one pass.

Four checks, each worth 0.25 in ``partial`` mode; ``strict`` gives 1.0 exactly when all
four hold, else 0.0:

1. think: exactly one ``<think>`` and one ``</think>``, open before close, non-blank content.
   With ``think_optional`` a response with no think tag at all passes this check.
2. answer: exactly one ``<answer>`` and one ``</answer>``, open before close, non-blank content.
3. order: checks 1 and 2 hold and ``</think>`` comes before ``<answer>`` (with
   ``think_optional`` and no think tags: check 2 holds).
4. clean: only whitespace before the first tag and after ``</answer>`` (the response, once
   stripped, starts with ``<think>`` — or ``<answer>`` when the think block is optional and
   absent — and ends with ``</answer>``), and only whitespace between ``</think>`` and
   ``<answer>`` when each occurs once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from arbiter.proto.verify import FormatParams


@dataclass(frozen=True)
class FormatChecks:
    think: bool
    answer: bool
    order: bool
    clean: bool

    @property
    def passed(self) -> int:
        return sum((self.think, self.answer, self.order, self.clean))


@lru_cache(maxsize=64)
def _tag_pattern(think: str, answer: str) -> re.Pattern[str]:
    return re.compile(f"<(/?)({re.escape(think)}|{re.escape(answer)})>")


def _block(positions: dict[str, list[tuple[int, int]]], text: str, tag: str) -> str | None:
    """Content of the single ``<tag>…</tag>`` block, or None if not exactly one well-ordered."""
    opens, closes = positions[tag], positions["/" + tag]
    if len(opens) != 1 or len(closes) != 1 or opens[0][1] > closes[0][0]:
        return None
    return text[opens[0][1] : closes[0][0]]


def check_format(text: str, params: FormatParams) -> FormatChecks:
    think, answer = params.think_tag, params.answer_tag
    positions: dict[str, list[tuple[int, int]]] = {
        think: [],
        "/" + think: [],
        answer: [],
        "/" + answer: [],
    }
    for m in _tag_pattern(think, answer).finditer(text):
        positions[m.group(1) + m.group(2)].append((m.start(), m.end()))

    no_think = not positions[think] and not positions["/" + think]
    think_free = params.think_optional and no_think
    think_body = _block(positions, text, think)
    answer_body = _block(positions, text, answer)
    think_ok = think_free or (think_body is not None and think_body.strip() != "")
    answer_ok = answer_body is not None and answer_body.strip() != ""

    if think_free:
        order_ok = answer_ok
    else:
        order_ok = (
            think_ok and answer_ok and positions["/" + think][0][1] <= positions[answer][0][0]
        )

    stripped = text.strip()
    first = answer if think_free else think
    clean_ok = stripped.startswith(f"<{first}>") and stripped.endswith(f"</{answer}>")
    if clean_ok and len(positions["/" + think]) == 1 and len(positions[answer]) == 1:
        gap_start, gap_end = positions["/" + think][0][1], positions[answer][0][0]
        clean_ok = gap_start <= gap_end and text[gap_start:gap_end].strip() == ""
    return FormatChecks(think_ok, answer_ok, order_ok, clean_ok)


def format_score(text: str, params: FormatParams) -> float:
    checks = check_format(text, params)
    if params.mode == "strict":
        return 1.0 if checks.passed == 4 else 0.0
    return checks.passed / 4
