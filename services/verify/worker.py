"""What runs inside a pool worker process: the whole ``math_accuracy`` rule for one response.

An item is ``(response, gold, rel_tolerance, fast, team)``: the worker extracts the response's
answer, decides plain numbers itself (the fast path: exact rationals, no math-verify) and
hands the rest to math-verify with its own timeouts on (``signal.alarm``: this process's
main thread). All of it runs here, not in the service's event loop, so a request's items
spread over every worker and core whatever connection it came on: on two cores the rule
measured 13 µs per GSM8K response, 3× the rest of the service's work per item (JSON,
validation, queueing), and done in the event loop it held the service to one core.

A worker receives chunks of items over its socket (the next one usually waits there while
it runs the current one), scores them one by one and sends back their results and times:
one message at the end of a chunk, plus one at each "flush point" the parent marks (where
the next request's items start, so that one request's results never wait on another's
item, nor die with a worker killed for it). It writes the id of the chunk it runs and,
before each item, ``(start time, item index)`` into a shared array, so the parent can tell
which item overran its wall-clock deadline without a message per item; and it reads the
array's "yield" mark: when the parent has raised it to this chunk's id (other requests
wait, or a request in the chunk was cancelled) it stops there and sends what it has.

This module is preloaded in the forkserver, and so is ``warm_up`` (which scores a few
items there once), so math-verify and sympy are imported and their lazy parts built once:
a replacement worker starts in milliseconds and its first item costs no more than others.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import time
from fractions import Fraction
from functools import lru_cache
from itertools import product
from multiprocessing.connection import Connection
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from arbiter.errors import ItemResult
from arbiter.services.verify.extract import INFO_CHARS, extract_answer
from arbiter.services.verify.normalize import (
    Number,
    latex_wrap,
    long_integer,
    looks_like_text,
    numbers_equal,
    plain_words,
    text_answer,
    to_number,
)

CORRECT, WRONG = ItemResult(1.0), ItemResult(0.0)
# response, gold (the reference's value), rel_tol, fast, team (whose reference cache it uses)
Item = tuple[str, str, float, bool, str]
# Per item: the result, how it was decided (a ``verify_math_path_total`` label: fast_path,
# math_verify, no_answer, conflict, failed) and the extracted answer, if any.
Scored = tuple[ItemResult, str, str | None]
FLUSH_S = 0.05  # a running chunk's results go back at least this often
# The shared array's slots: the running item's index, its start time, "stop every chunk
# with an id up to this one after its current item", and the id of the chunk being run.
RUNNING, STARTED, YIELD, CHUNK = 0, 1, 2, 3

# math-verify logs a warning for every timeout; we report them as results instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)


# What Math-Verify's own tests parse with (``compare_strings``): boxes first, then the
# last LaTeX expression, then the last plain expression.
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


# A relation answers a set or interval reference (``x \\le 3`` for ``(-\\infty, 3]``), as it
# already answers one written as a relation: math-verify's default allows only the latter.
_VERIFY = {"allow_set_relation_comp": True}
# Text that already marks its math: math-verify reads it as written (``\\$`` and all).
_DELIMITED = ("$", "\\(", "\\[", "\\boxed", "\\fbox")


class _ItemTimeout(Exception):
    pass


def _decimal(v: Fraction) -> str | None:
    """``v`` as a finite decimal (``4.123105625617661``), when it has one of few digits:
    math-verify compares a decimal with a surd to its rounding, a fraction exactly."""
    den, twos, fives = v.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    places = max(twos, fives)
    if den != 1 or places > 30:
        return None
    digits = str(abs(v.numerator) * 10**places // v.denominator).rjust(places + 1, "0")
    sign = "-" if v < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _mv_text(text: str, whole: bool = False) -> str:
    """What math-verify reads: a plain number in canonical form (so ``72 dollars`` is not
    read as the product 72·d·o·l·l·a·r·s), a whole response as it is (math-verify's own
    extraction picks its answer), anything else with LaTeX delimiters."""
    num = to_number(text)
    if num is None:
        raw = text.strip()
        if any(d in raw for d in _DELIMITED) or (whole and "\n" in raw):
            return raw  # math-verify's own extraction, on the text as written
        return latex_wrap(text)
    v = num.value
    if v.denominator == 1:
        body = str(v.numerator)
    else:
        body = _decimal(v) or f"\\frac{{{v.numerator}}}{{{v.denominator}}}"
    return f"${body}\\%$" if num.percent else f"${body}$"


def _parse(text: str, timeout_s: int, whole: bool = False) -> list[Any]:
    try:
        return list(
            parse(
                _mv_text(text, whole),
                _EXTRACTION,
                parsing_timeout=timeout_s,
                raise_on_error=True,
            )
        )
    except TimeoutException as exc:
        raise _ItemTimeout("math-verify timed out parsing") from exc
    except Exception:  # math-verify raising on odd input means "nothing parsed"
        return []


# Large enough for every reference of a big batch: the pool interleaves requests (fair
# shares), so a small cache would see each group's reference evicted between its items.
# Keyed by team as well: a cache shared by all teams would tell one team, by the time its
# items take (23 vs 33 ms measured), that another team just used the same reference.
@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int, team: str = "") -> tuple[Any, ...]:
    return tuple(_parse(gold, timeout_s))


def _mv_equal(gold: tuple[Any, ...], pred: list[Any], timeout_s: int) -> bool:
    """Gold first, each pair under its own math-verify timeout."""
    timed_out = False
    for g, p in product(gold, pred):
        try:
            if verify(g, p, timeout_seconds=timeout_s, raise_on_error=True, **_VERIFY):
                return True
        except TimeoutException:
            timed_out = True
        except Exception:  # a comparison that raises is not a match
            continue
    if timed_out:
        raise _ItemTimeout("math-verify timed out comparing")
    return False


def score_item(
    gold: str,
    pred: str,
    rel_tolerance: float,
    timeout_s: int,
    always_mv: bool = False,
    team: str = "",
    whole: bool = False,
) -> ItemResult:
    """1.0 / 0.0, or null with a kind. Equal as numbers (our normalisation) or equal for
    math-verify counts as equal. ``always_mv`` runs math-verify even when the numbers
    already agree (the benchmark's no-fast-path mode). ``team``: whose parsed references
    to reuse (each team has its own). ``whole``: ``pred`` is a whole response, for
    math-verify's own extraction."""
    g_num, p_num = to_number(gold), to_number(pred)
    numeric = g_num is not None and p_num is not None
    num_equal = (
        g_num is not None and p_num is not None and numbers_equal(g_num, p_num, rel_tolerance)
    )
    if num_equal and not always_mv:
        return CORRECT
    if g_num is None and (error := _gold_error(gold, timeout_s, team)) is not None:
        return error
    try:
        gold_parsed = _parse_gold(gold, timeout_s, team)
        pred_parsed = _parse(pred, timeout_s, whole) if gold_parsed else []
        mv_equal = bool(pred_parsed) and _mv_equal(gold_parsed, pred_parsed, timeout_s)
        return CORRECT if mv_equal or num_equal else WRONG
    except _ItemTimeout as exc:
        if numeric:  # both plain numbers: their comparison stands
            return CORRECT if num_equal else WRONG
        return ItemResult(None, "timeout", f"{exc} (limit {timeout_s}s per step)")
    except RecursionError:
        return ItemResult(None, "internal", "expression too deeply nested")


@lru_cache(maxsize=4096)
def _gold_number(gold: str, team: str = "") -> Number | None:
    return to_number(gold)


def _gold_error(gold: str, timeout_s: int, team: str = "") -> ItemResult | None:
    """The null result every response gets when the reference's value is not math (or
    math-verify timed out reading it); ``None`` when it is fine."""
    if _gold_number(gold, team) is not None:
        return None
    try:
        parsed = _parse_gold(gold, timeout_s, team)
    except _ItemTimeout as exc:
        return ItemResult(None, "timeout", f"{exc} (limit {timeout_s}s per step)")
    if parsed and not looks_like_text(gold):
        return None
    return ItemResult(None, "invalid_reference", f"reference {gold[:64]!r} is not a math value")


def _fast(gold: str, pred: str, rel_tolerance: float, team: str) -> ItemResult | None:
    """Plain numbers on both sides, compared as exact rationals; ``None``: not that case."""
    g_num = _gold_number(gold, team)
    if g_num is None:
        return None
    p_num = to_number(pred)
    if p_num is not None:
        return CORRECT if numbers_equal(g_num, p_num, rel_tolerance) else WRONG
    if g_num.value.denominator == 1 and not g_num.percent:
        digits = long_integer(pred)  # integers compare exactly, whatever their length
        if digits is not None:
            return CORRECT if digits == str(g_num.value.numerator) else WRONG
    return None


def score_response(
    response: str,
    gold: str,
    rel_tolerance: float,
    timeout_s: int,
    fast: bool = True,
    team: str = "",
) -> Scored:
    """The rule for one response against the reference's value ``gold``; with ``fast`` off
    every extracted answer goes through math-verify. ``team`` keys the reference caches."""
    ex = extract_answer(response)
    if ex.status != "ok":
        path = "conflict" if ex.status == "conflict" else "no_answer"
        return _gold_error(gold, timeout_s, team) or WRONG, path, None
    answer = ex.text.strip()[:INFO_CHARS]
    words = _gold_words(gold, team)
    if words is not None:  # a word answer (``\\text{odd}``): the same words, or wrong
        return (CORRECT if plain_words(ex.text) == words else WRONG), "text", answer
    decided = _fast(gold, ex.text, rel_tolerance, team) if fast else None
    if decided is not None:
        return decided, "fast_path", answer
    whole = ex.source == "whole"
    result = score_item(gold, ex.text, rel_tolerance, timeout_s, not fast, team, whole)
    if ex.parts > 1 and result.score == 0.0:  # several boxes, not the reference's parts
        return result, "conflict", answer
    return result, "math_verify", answer


@lru_cache(maxsize=4096)
def _gold_words(gold: str, team: str = "") -> str | None:
    return text_answer(gold)


def worker_main(conn: Connection, shared: Any, timeout_s: int, nice: int = 0) -> None:
    """Serve chunks until the socket closes or ``None`` arrives."""
    # The parent coordinates shutdown: ignore Ctrl-C's SIGINT, die on SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.freeze()  # the preloaded sympy/math-verify heap: out of every full collection's walk
    os.nice(nice)  # below the event loop, which admits requests and delivers results
    try:
        conn.send(("ready", None))
    except OSError:  # the pool closed while this worker started (shutdown): nothing to do
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        chunk_id, items, flush_at = msg
        shared[RUNNING] = -1.0  # not started: the parent times it from the previous end
        shared[CHUNK] = float(chunk_id)
        first, sent = 0, time.monotonic()  # the first result not sent yet; last send
        results: list[Scored] = []
        seconds: list[float] = []  # each item's time, for the pool's fair share
        for i, (response, gold, rel_tol, fast, team) in enumerate(items):
            if shared[YIELD] >= chunk_id:  # hand the rest back (see pool.py)
                break
            started = time.monotonic()
            # Send what is done where another request's items start, and every FLUSH_S:
            # a worker killed for an overrun then loses no finished result.
            if results and (i in flush_at or started - sent >= FLUSH_S):
                conn.send((chunk_id, first, results, seconds, False))
                first, results, seconds, sent = i, [], [], started
            shared[STARTED] = started  # start time first, then the index
            shared[RUNNING] = float(i)
            try:
                results.append(score_response(response, gold, rel_tol, timeout_s, fast, team))
            except Exception as exc:  # never let one item take the worker down
                results.append((ItemResult.failed(exc), "failed", None))
            seconds.append(time.monotonic() - started)
        shared[STARTED] = time.monotonic()  # "sending": index past the end
        shared[RUNNING] = float(len(items))
        conn.send((chunk_id, first, results, seconds, True))


def warm_up() -> None:
    """Score a few items of each kind once (the forkserver calls this at preload). Best
    effort: a failure here only means the first items are slower."""
    with contextlib.suppress(Exception):
        _warm_up()


def _warm_up() -> None:
    # ("3", "\\sqrt{16}") reaches sympy's simplify, whose first call imports sympy.physics
    # (1.4 s): done here once, not by the first such item of every worker.
    pairs = (("5", "\\sqrt{25}"), ("x+1", "1+x"), ("\\frac{1}{2}", "0.5"), ("3", "3!"))
    for gold, pred in (*pairs, ("3", "\\sqrt{16}"), ("x = 2, y = 3", "(2, 3)")):
        score_item(gold, pred, 1e-6, 5, True)
        score_response(f"<answer>{pred}</answer>", gold, 1e-6, 5)
