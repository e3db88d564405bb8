"""Answer extraction and numeric normalisation for ``math_accuracy`` (pure Python, linear time).

Everything here runs in the service's event loop, so every scan is linear in the input
length: tags and braces are tokenised once with ``re.finditer`` and paired with a stack,
never matched with lazy ``.*?`` patterns that rescan the text from every start position.

Extraction priority (the first rule that finds something wins):

1. the content of ``<answer>…</answer>`` (two or more blocks whose values differ → conflict);
2. the ``\\boxed{…}`` / ``\\fbox{…}`` with balanced braces: one value, or several different
   ones, which are the answer together (``\\boxed{1} and \\boxed{-2}``: the set {1, -2}, as
   math-verify reads them); against a reference of one part that is a hedge, scored 0;
3. the text after the last ``#### ``;
4. the text after the last "answer is" / "answer:" or a line starting with ``A:``;
5. the last number when it ends the response; else, when the response writes LaTeX (a
   command, ``\\(``, ``\\[``, ``$$`` or ``$…$`` that is not a price), the whole response, for
   math-verify's own extraction (its last LaTeX expression); else the last number.

Inside an ``<answer>`` block, rules 2–4 are applied again to its content (so
``<answer>The answer is \\boxed{18}.</answer>`` gives ``18``), else the whole content is the
candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from arbiter.services.verify.normalize import boxed_contents, clean, to_number

__all__ = ["Extraction", "answer_blocks", "boxed_contents", "extract_answer", "reference_value"]

# Candidates are cut to this many characters in the response's ``info``.
INFO_CHARS = 64

_ANSWER_TAG = re.compile(r"<(/?)answer\s*>", re.IGNORECASE)
_HASHES = re.compile(r"####")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is|:|=)\s*|(?:^|\n)[ \t]*A[ \t]*:[ \t]*", re.IGNORECASE)
# LaTeX in a response: a command, \( \[ $$, or $…$ that is not a price ("$4.00 + $2.00").
_LATEX_MARK = re.compile(r"\\[A-Za-z(\[]|\$\$")
_PRICE = re.compile(r"(?<![\w$])\$\d+(?:,\d{3})*+(?:\.\d+)?+(?=[\s;!?)]|[.,](?!\d)|$)")
# The last number ends the response: "So she has 7 in the end" does not, "is $33$." does.
_NUMBER_AT_END = re.compile(r"[\s$*.!]*")
# Numbers: optional sign, thousands groups or plain digits, decimals, an optional /q part.
# Also ``1 000`` and a decimal comma after 0 or 4+ digits (``0,111``), as math-verify reads.
_NUMBER = re.compile(
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+(?![\d.,])|(?:0|\d{4,}),\d+|\d+)"
    r"(?:\.\d+)?(?:/\d+(?:\.\d+)?)?%?|(?<![\w.])-?\.\d+%?"
)

Source = Literal["answer_tag", "boxed", "hashes", "answer_is", "last_number", "whole"]


@dataclass(frozen=True)
class Extraction:
    """What was taken from a response: a candidate, nothing, or a conflict (anti-hacking)."""

    status: Literal["ok", "none", "conflict"]
    text: str = ""
    source: Source | None = None
    detail: str = ""
    # Several boxes with different values, taken together: a hedge unless the reference
    # has that many parts (the scorer calls a wrong one a conflict).
    parts: int = 1


# ---------------------------------------------------------------- scanning helpers


def answer_blocks(text: str) -> list[str]:
    """Contents of each ``<answer>…</answer>`` pair (an open tag pairs with the next close)."""
    blocks: list[str] = []
    start: int | None = None
    for m in _ANSWER_TAG.finditer(text):
        if m.group(1) == "":
            start = m.end()  # a second open before a close restarts the block
        elif start is not None:
            blocks.append(text[start : m.start()])
            start = None
    return blocks


def _rest_of_line(text: str, pos: int) -> str:
    end = text.find("\n", pos)
    return text[pos:] if end < 0 else text[pos:end]


def _after_last(pattern: re.Pattern[str], text: str) -> str | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    return _rest_of_line(text, last.end())


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007
        pass
    return last


def _last_box_start(text: str) -> int:
    return max(text.rfind("\\boxed"), text.rfind("\\fbox"))


def _first_sentence(line: str) -> str:
    """``$v$. I hope it is correct.`` → ``$v$``: up to the first full stop outside ``$…$``
    that ends a sentence (followed by a space); the whole line when math is not written."""
    if "$" not in line:
        return line
    inside = False
    for i, c in enumerate(line):
        if c == "$" and (i == 0 or line[i - 1] != "\\"):
            inside = not inside
        elif c == "." and not inside and line[i + 1 : i + 2] in (" ", ""):
            return line[:i]
    return line


def _ends_with(text: str, num: re.Match[str]) -> bool:
    """The number ``num`` ends ``text`` on its own: only spaces, ``$``, ``*``, ``.`` or ``!``
    after it, and before it a space, ``*`` or the ``$`` of ``$33$`` - not the end of a
    formula (``$x = 2, y = 3$``, ``$11:21$``), whose ``$`` is still open."""
    if not _NUMBER_AT_END.fullmatch(text, num.end()):
        return False
    before = text[num.start() - 1] if num.start() else " "
    if before == "$":
        return True
    if not (before.isspace() or before == "*"):
        return False
    if text.count("$", 0, num.start()) % 2 == 0:
        return True
    return _PRICE.search(text) is not None and _LATEX_MARK.search(text) is None  # prices


def last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007
        pass
    return None if last is None else last.group()


def _key(candidate: str) -> str:
    """Comparison key for the anti-hacking checks: the number if it is one, else the text."""
    num = to_number(candidate)
    if num is not None:
        return f"n:{num.value}:{num.percent}"
    return "s:" + "".join(clean(candidate).split())


# ---------------------------------------------------------------- extraction


def _refine(text: str, allow_whole: bool) -> Extraction:
    """Rules 2–4 (and 5 when ``allow_whole`` is False) applied to ``text``."""
    boxes = [b for b in boxed_contents(text) if b.strip()]
    if boxes:  # "\boxed{200} … \boxed{255} … The final answer is $10,455$": the statement
        stated = _last_match(_ANSWER_IS, text)
        if stated is not None and stated.start() > _last_box_start(text):
            boxes = []
    if boxes:
        distinct: dict[str, str] = {}
        for b in boxes:
            distinct.setdefault(_key(b), b)
        if len(distinct) > 1:
            joined = " and ".join(f"\\boxed{{{b}}}" for b in distinct.values())
            return Extraction("ok", joined, "boxed", parts=len(distinct))
        return Extraction("ok", boxes[-1], "boxed")
    after = _after_last(_HASHES, text)
    if after is not None and after.strip():
        return Extraction("ok", after, "hashes")
    after = _after_last(_ANSWER_IS, text)
    if after is not None and after.strip():
        return Extraction("ok", _first_sentence(after), "answer_is")
    if allow_whole:
        return Extraction("ok", text, "answer_tag") if text.strip() else Extraction("none")
    num = _last_match(_NUMBER, text)
    if num is not None and _ends_with(text, num):
        return Extraction("ok", num.group(), "last_number")
    if _LATEX_MARK.search(text) or ("$" in text and _PRICE.search(text) is None):
        return Extraction("ok", text, "whole")  # math-verify's own extraction reads it
    return Extraction("ok", num.group(), "last_number") if num else Extraction("none")


def extract_answer(response: str) -> Extraction:
    """Apply the extraction priority to a whole response."""
    blocks = answer_blocks(response)
    if blocks:
        found = [_refine(b, allow_whole=True) for b in blocks]
        if any(f.status == "conflict" for f in found):
            return next(f for f in found if f.status == "conflict")
        oks = [f for f in found if f.status == "ok"]
        if not oks:
            return Extraction("none", detail="empty <answer> block")
        if len(oks) > 1 and len({_key(f.text) for f in oks}) > 1:
            detail = f"{len(oks)} <answer> blocks with different values"
            return Extraction("conflict", detail=detail)
        return Extraction("ok", oks[-1].text, "answer_tag", parts=oks[-1].parts)
    return _refine(response, allow_whole=False)


def reference_value(reference: str | None) -> str | None:
    """The gold value: what follows the last ``####`` of a GSM8K answer, else the whole text."""
    if reference is None:
        return None
    after = _after_last(_HASHES, reference)
    value = (after if after is not None else reference).strip()
    return value if clean(value) else None
