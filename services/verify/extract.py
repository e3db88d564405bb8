"""Answer extraction and numeric normalisation for ``math_accuracy`` (pure Python, linear time).

Everything here runs in the service's event loop, so every scan is linear in the input
length: tags and braces are tokenised once with ``re.finditer`` and paired with a stack,
never matched with lazy ``.*?`` patterns that rescan the text from every start position.

Extraction priority (the first rule that finds something wins):

1. the content of ``<answer>…</answer>`` (two or more blocks whose values differ → conflict);
2. the last ``\\boxed{…}`` / ``\\fbox{…}`` with balanced braces (boxes with different values
   → conflict);
3. the text after the last ``#### ``;
4. the text after the last "answer is" / "answer:" or a line starting with ``A:``;
5. the last number in the response.

Inside an ``<answer>`` block, rules 2–4 are applied again to its content (so
``<answer>The answer is \\boxed{18}.</answer>`` gives ``18``), else the whole content is the
candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

# A plain number longer than this is not decided here (converting it is not O(1)); it goes
# to the worker pool, where the per-item deadline applies.
MAX_FAST_DIGITS = 200
# Candidates are cut to this many characters in the response's ``info``.
INFO_CHARS = 64

_ANSWER_TAG = re.compile(r"<(/?)answer\s*>", re.IGNORECASE)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*(?=\{)")
_BRACE = re.compile(r"\\[{}]|[{}]")
_HASHES = re.compile(r"####")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is|:|=)\s*|(?:^|\n)[ \t]*A[ \t]*:[ \t]*", re.IGNORECASE)
# Numbers: optional sign, thousands groups or plain digits, decimals, an optional /q part.
_NUMBER = re.compile(
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?%?|(?<![\w.])-?\.\d+%?"
)

# Normalisation of a candidate into a number.
_FACTORIAL_BEFORE = frozenset("0123456789)}]")
_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox|operatorname)\s*\{")
_LATEX_DROP = re.compile(
    r"\\[,!;: ]|\\(?:left|right|displaystyle|quad|qquad)\b|\\\(|\\\)|\\\[|\\\]"
)
_FRAC = re.compile(r"^([-+]?)\\[dt]?frac\s*\{\s*([-+]?\d+)\s*\}\s*\{\s*(\d+)\s*\}$")
_FRAC_SHORT = re.compile(r"^([-+]?)\\[dt]?frac(\d)(\d)$")
_PLAIN = re.compile(
    r"^([-+]?)\s*(?:\$|usd|€|£)?\s*([-+]?)"
    r"(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)"
    r"(?:\s*/\s*(\d+))?"
    r"\s*(%|percent\b)?"
    r"(?:\s*[A-Za-z][A-Za-z .'/-]*)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Number:
    """A plain number; ``percent`` when it was written with ``%`` (then 50% means 50 or 0.5)."""

    value: Fraction
    percent: bool = False

    def candidates(self) -> tuple[Fraction, ...]:
        return (self.value, self.value / 100) if self.percent else (self.value,)


Source = Literal["answer_tag", "boxed", "hashes", "answer_is", "last_number"]


@dataclass(frozen=True)
class Extraction:
    """What was taken from a response: a candidate, nothing, or a conflict (anti-hacking)."""

    status: Literal["ok", "none", "conflict"]
    text: str = ""
    source: Source | None = None
    detail: str = ""


# ---------------------------------------------------------------- scanning helpers


def _brace_pairs(text: str) -> dict[int, int]:
    """Map each unescaped ``{`` position to its matching ``}`` (one linear pass)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text):
        tok = m.group()
        if tok.startswith("\\"):
            continue
        if tok == "{":
            stack.append(m.start())
        elif stack:
            pairs[stack.pop()] = m.start()
    return pairs


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{…}`` with balanced braces, in order of appearance."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    pairs = _brace_pairs(text)
    out: list[str] = []
    for m in _BOX.finditer(text):
        open_pos = m.end()
        close = pairs.get(open_pos)
        if close is not None:
            out.append(text[open_pos + 1 : close])
    return out


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


def last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007
        pass
    return None if last is None else last.group()


# ---------------------------------------------------------------- normalisation


def strip_punctuation(s: str) -> str:
    """Drop trailing ``.``, ``;``, ``,`` and ``!`` - except a ``!`` right after a digit or a
    closing bracket, which is a factorial (``10000!`` is not 10000; ``18 !`` and ``yes!`` are
    prose). Such a candidate is not a plain number: math-verify decides it in the pool,
    under the item's deadline, so a huge factorial costs at most that deadline."""
    s = s.strip()
    while s and s[-1] in ".;,!":
        if s[-1] == "!" and len(s) > 1 and s[-2] in _FACTORIAL_BEFORE:
            break
        s = s[:-1].rstrip()
    return s


def clean(candidate: str) -> str:
    """Strip markdown emphasis, LaTeX wrappers and trailing punctuation from a candidate."""
    s = candidate.strip()
    s = s.replace("**", "").replace("__", "").strip("*_ \t\n")
    s = _LATEX_DROP.sub(" ", s).strip()
    if s.startswith("$$") and s.endswith("$$") and len(s) > 3:
        s = s[2:-2]
    elif len(s) > 1 and s[0] == s[-1] == "$" and s.replace("\\$", "").count("$") == 2:
        s = s[1:-1]
    s = s.replace("\\$", "$").replace("\\%", "%").replace("{,}", ",")
    s = strip_punctuation(s)
    inner = boxed_contents(s)
    if inner and s.startswith(("\\boxed", "\\fbox")):
        s = inner[-1].strip()
    return s


def _unwrap_text(s: str) -> str:
    """``\\text{ dollars}`` → `` dollars`` (only when braces balance)."""
    while True:
        m = _LATEX_WRAPPERS.search(s)
        if m is None:
            return s
        open_pos = m.end() - 1
        close = _brace_pairs(s).get(open_pos)
        if close is None:
            return s
        s = s[: m.start()] + s[open_pos + 1 : close] + s[close + 1 :]


def to_number(candidate: str) -> Number | None:
    """The value of a candidate that is a plain number, as a person reads it; else None.

    Accepts ``$1,000``, ``1,000``, ``1000.00``, ``72 dollars``, ``\\frac{36}{2}``, ``3/4``,
    ``50%``, ``x = 5``; thousands separators must be groups of three. Numbers longer than
    ``MAX_FAST_DIGITS`` are left to math-verify (None here).
    """
    s = clean(candidate)
    if len(s) > MAX_FAST_DIGITS + 40:
        return None
    s = _unwrap_text(s)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    s = strip_punctuation(s)
    s = s.replace("\u2212", "-")
    m = _FRAC.match(s) or _FRAC_SHORT.match(s)
    if m:
        sign, num, den = m.groups()
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return Number(-value if sign == "-" else value)
    m = _PLAIN.match(s)
    if m is None:
        return None
    sign1, sign2, digits, den, pct = m.groups()
    digits = digits.replace(",", "")
    if digits.endswith("."):
        digits = digits[:-1]
    try:  # an integer (most answers) skips Fraction's string parser
        value = Fraction(int(digits)) if digits.isdigit() else Fraction(digits)
    except (ValueError, ZeroDivisionError):
        return None
    if den is not None:
        if int(den) == 0:
            return None
        value /= int(den)
    if (sign1 == "-") != (sign2 == "-"):
        value = -value
    return Number(value, percent=pct is not None)


_LONG_INTEGER = re.compile(r"[-+]?\d+")


def long_integer(candidate: str) -> str | None:
    """A plain integer too long for ``to_number``, as canonical digits (``-`` kept, leading
    zeros dropped); else None. Linear time: a 100,000-digit answer is compared here as a
    string instead of costing a pool worker seconds of math-verify."""
    s = clean(candidate)
    if len(s) <= MAX_FAST_DIGITS or _LONG_INTEGER.fullmatch(s) is None:
        return None
    digits = s.lstrip("+-").lstrip("0")
    if not digits:
        return "0"
    return "-" + digits if s[0] == "-" else digits


def numbers_equal(gold: Number, pred: Number, rel_tolerance: float) -> bool:
    """Exact when both are integers; within ``rel_tolerance`` (relative) otherwise."""
    for g in gold.candidates():
        for p in pred.candidates():
            if g == p:
                return True
            if g.denominator == 1 and p.denominator == 1:
                continue
            scale = max(abs(g), abs(p))
            if abs(g - p) <= Fraction(rel_tolerance) * scale:
                return True
    return False


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
    if boxes:
        if len(boxes) > 1 and len({_key(b) for b in boxes}) > 1:
            return Extraction("conflict", detail=f"{len(boxes)} \\boxed{{}} with different values")
        return Extraction("ok", boxes[-1], "boxed")
    after = _after_last(_HASHES, text)
    if after is not None and after.strip():
        return Extraction("ok", after, "hashes")
    after = _after_last(_ANSWER_IS, text)
    if after is not None and after.strip():
        return Extraction("ok", after, "answer_is")
    if allow_whole:
        return Extraction("ok", text, "answer_tag") if text.strip() else Extraction("none")
    num = last_number(text)
    return Extraction("ok", num, "last_number") if num else Extraction("none")


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
        return Extraction("ok", oks[-1].text, "answer_tag")
    return _refine(response, allow_whole=False)


def reference_value(reference: str | None) -> str | None:
    """The gold value: what follows the last ``####`` of a GSM8K answer, else the whole text."""
    if reference is None:
        return None
    after = _after_last(_HASHES, reference)
    value = after if after is not None else reference
    value = clean(value)
    return value or None


_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")


def looks_like_text(value: str) -> bool:
    """A reference with no digit and a word of 3+ letters (LaTeX commands aside) is prose,
    which math-verify would happily read as a product of symbols."""
    if any(c.isdigit() for c in value):
        return False
    return _WORD.search(_COMMAND.sub(" ", _unwrap_text(value))) is not None


def latex_wrap(candidate: str) -> str:
    """Give math-verify LaTeX delimiters when the candidate has none."""
    s = clean(candidate)
    if "$" in s or "\\(" in s or "\\[" in s:
        return s
    return f"${s}$"
