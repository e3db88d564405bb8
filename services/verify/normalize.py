"""Normalisation of a candidate answer (pure Python, linear time): LaTeX wrappers and
spacing, thousands separators, plain numbers, word answers.

A *plain number* is decided without math-verify (the fast path); everything else goes to
math-verify as a whole: a relation (``x >= 5``), a system (``x = 2, y = 3``) or several
boxes (``\\boxed{1} and \\boxed{-2}``) is never cut to the number after its last ``=`` or
to its last box.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

# A plain number longer than this is not decided here (converting it is not O(1)); it goes
# to the worker pool, where the per-item deadline applies.
MAX_FAST_DIGITS = 200

_BOX = re.compile(r"\\(?:boxed|fbox)\s*(?=\{)")
_BRACE = re.compile(r"\\[{}]|[{}]")
# Normalisation of a candidate into a number.
_FACTORIAL_BEFORE = frozenset("0123456789)}]")
_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox|operatorname)\s*\{")
# A thousands separator written in LaTeX between digit groups: ``10,\!000``, ``10\,000``,
# ``11,\! 111``, ``10{,}000`` (becomes ``,`` before the spacing commands are dropped).
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:,|\{,\})?\s*+(?:\\[!,;: ]\s*+)++(?=\d{3}(?!\d))")
_THOUSANDS_CHARS = 4096
_LATEX_DROP = re.compile(
    r"(?<!\\)\\[,!;: ]|\\(?:left|right|displaystyle|quad|qquad)\b|\\\(|\\\)|\\\[|\\\]"
)
_FRAC = re.compile(r"^([-+]?)\\[dt]?frac\s*\{\s*([-+]?\d+)\s*\}\s*\{\s*(\d+)\s*\}$")
_FRAC_SHORT = re.compile(r"^([-+]?)\\[dt]?frac(\d)(\d)$")
_PLAIN = re.compile(
    r"^([-+]?)\s*(?:\$|usd|€|£)?\s*([-+]?)"
    r"(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:\.\d*)?"
    r"|\d+(?:\.\d*)?|\.\d+)"
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
    if len(s) <= _THOUSANDS_CHARS:  # longer is no plain number: math-verify reads them
        s = _LATEX_THOUSANDS.sub(",", s)
    s = _LATEX_DROP.sub(" ", s).strip()
    if s.startswith("$$") and s.endswith("$$") and len(s) > 3:
        s = s[2:-2]
    elif len(s) > 1 and s[0] == s[-1] == "$" and s.replace("\\$", "").count("$") == 2:
        s = s[1:-1]
    s = s.replace("\\$", "$").replace("\\%", "%").replace("{,}", ",")
    s = strip_punctuation(s)
    return _unbox_whole(s)


def _unbox_whole(s: str) -> str:
    """``\\boxed{v}`` → ``v`` when that one box is the whole text; ``\\boxed{1} and
    \\boxed{-2}`` stays whole (cut to its last box it was a fragment of the answer)."""
    m = _BOX.match(s)
    if m is None or _brace_pairs(s).get(m.end()) != len(s) - 1:
        return s
    return s[m.end() + 1 : -1].strip()


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

    Accepts ``$1,000``, ``1,000``, ``1 000``, ``10,\\!000``, ``1000.00``, ``72 dollars``,
    ``\\frac{36}{2}``, ``3/4``, ``50%``, ``x = 5``; thousands separators must be groups of
    three. An assignment counts only as one symbol ``=`` one number: ``x >= 5``, ``x != 3``,
    ``a + 3z = 0`` and ``x = 2, y = 3`` are relations or systems, never their last number.
    Numbers longer than ``MAX_FAST_DIGITS`` are left to math-verify (None here).
    """
    s = clean(candidate)
    if len(s) > MAX_FAST_DIGITS + 40:
        return None
    s = _unwrap_text(s)
    if "=" in s:
        m = _ASSIGNMENT.match(s)
        if m is None or "=" in s[m.end() :]:
            return None
        s = s[m.end() :]
    s = strip_punctuation(s)
    s = s.replace("\u2212", "-")
    if _DECIMAL_COMMA.fullmatch(s):  # 0,111 and 1000,99 (not 1,000 nor 1,22): a decimal comma
        s = s.replace(",", ".")
    m = _FRAC.match(s) or _FRAC_SHORT.match(s)
    if m:
        sign, num, den = m.groups()
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return Number(-value if sign == "-" else value)
    m = _PLAIN.match(s)
    if m is None or _OR.search(s):  # "5 or x" is a hedge, not 5 and a unit
        return None
    sign1, sign2, digits, den, pct = m.groups()
    digits = _GROUP_SEPARATORS.sub("", digits)
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


_ASSIGNMENT = re.compile(r"\s*[A-Za-z](?:_\{?\w+\}?)?\s*=(?![=<>])\s*")
_OR = re.compile(r"\bor\b", re.IGNORECASE)
_DECIMAL_COMMA = re.compile(r"[-+]?(?:0|\d{4,}),\d+")
_GROUP_SEPARATORS = re.compile("[, \u00a0\u202f]")
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


_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")


def looks_like_text(value: str) -> bool:
    """A reference with no digit, no LaTeX text wrapper and a word of 3+ letters (LaTeX
    commands aside) is prose, which math-verify would happily read as a product of symbols.
    ``\\text{odd}`` is a word answer (see ``text_answer``), not prose."""
    if any(c.isdigit() for c in value) or _LATEX_WRAPPERS.search(value):
        return False
    return _WORD.search(_COMMAND.sub(" ", value)) is not None


_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|textit|mbox)\s*\{")
_TEXT_ONLY = re.compile(r"[A-Za-z][A-Za-z .,'-]*")


def text_answer(value: str) -> str | None:
    """A reference written as LaTeX text (``\\text{odd}``, ``\\text{The midpoints form a
    regular hexagon}``), as comparable words (case and spacing folded); else None. Such a
    reference is compared as words, not by math-verify, which reads ``odd`` as the product
    o·d·d (equal to ``dod``)."""
    s = clean(value)
    if _TEXT_WRAPPER.match(s) is None:  # \mathrm{e} is math (a constant), not words
        return None
    return plain_words(s)


def plain_words(value: str) -> str | None:
    """``value`` as words: LaTeX text wrappers and ``$`` dropped, case and spacing folded;
    None when anything but letters and simple punctuation remains."""
    s = strip_punctuation(_unwrap_text(clean(value)).replace("$", "")).strip()
    if s.startswith("(") and s.endswith(")"):  # a choice written ``(C)``
        s = s[1:-1].strip()
    if _TEXT_ONLY.fullmatch(s) is None:
        return None
    return " ".join(s.casefold().split())


def latex_wrap(candidate: str) -> str:
    """Give math-verify LaTeX delimiters when the candidate has none."""
    s = clean(candidate)
    if "$" in s or "\\(" in s or "\\[" in s:
        return s
    return f"${s}$"
