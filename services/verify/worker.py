"""What runs inside a pool worker process: math-verify with its own timeouts on.

A worker receives a chunk of items ``(gold, pred, rel_tolerance)`` over its socket, scores
them one by one and sends back their results and times: one message at the end, plus one
at each "flush point" the parent marks (where the next request's items start, so that one
request's results never wait on another's item, nor die with a worker killed for it).
Before each item it writes ``(start time, item index)`` into a shared array, so the
parent can tell which item overran its wall-clock deadline without a message per item;
and it reads the array's "yield" flag: when the parent has raised it (other requests wait,
or this chunk's request was cancelled) it stops there and sends the results it has.

This module is preloaded in the forkserver, and so is ``warm_up`` (which scores a few
items there once), so math-verify and sympy are imported and their lazy parts built once:
a replacement worker starts in milliseconds and its first item costs no more than others.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import time
from functools import lru_cache
from itertools import product
from multiprocessing.connection import Connection
from typing import Any

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from arbiter.errors import ItemResult
from arbiter.services.verify.extract import latex_wrap, looks_like_text, numbers_equal, to_number

CORRECT, WRONG = ItemResult(1.0), ItemResult(0.0)
Item = tuple[str, str, float, bool]  # gold, pred, rel_tolerance, always_mv
# The shared array's slots: the running item's index, its start time, the yield flag.
RUNNING, STARTED, YIELD = 0, 1, 2

# math-verify logs a warning for every timeout; we report them as results instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)


class _ItemTimeout(Exception):
    pass


def _mv_text(text: str) -> str:
    """What math-verify reads: a plain number in canonical form (so ``72 dollars`` is not
    read as the product 72·d·o·l·l·a·r·s), anything else with LaTeX delimiters."""
    num = to_number(text)
    if num is None:
        return latex_wrap(text)
    v = num.value
    body = str(v.numerator) if v.denominator == 1 else f"\\frac{{{v.numerator}}}{{{v.denominator}}}"
    return f"${body}\\%$" if num.percent else f"${body}$"


def _parse(text: str, timeout_s: int, gold: bool) -> list[Any]:
    try:
        return list(
            parse(
                _mv_text(text),
                fallback_mode="no_fallback" if gold else "first_match",
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
@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int) -> tuple[Any, ...]:
    return tuple(_parse(gold, timeout_s, gold=True))


def _mv_equal(gold: tuple[Any, ...], pred: list[Any], timeout_s: int) -> bool:
    """Gold first, each pair under its own math-verify timeout."""
    timed_out = False
    for g, p in product(gold, pred):
        try:
            if verify(g, p, timeout_seconds=timeout_s, raise_on_error=True):
                return True
        except TimeoutException:
            timed_out = True
        except Exception:  # a comparison that raises is not a match
            continue
    if timed_out:
        raise _ItemTimeout("math-verify timed out comparing")
    return False


def score_item(
    gold: str, pred: str, rel_tolerance: float, timeout_s: int, always_mv: bool = False
) -> ItemResult:
    """1.0 / 0.0, or null with a kind. Equal as numbers (our normalisation) or equal for
    math-verify counts as equal. ``always_mv`` runs math-verify even when the numbers
    already agree (the benchmark's no-fast-path mode)."""
    g_num, p_num = to_number(gold), to_number(pred)
    numeric = g_num is not None and p_num is not None
    num_equal = (
        g_num is not None and p_num is not None and numbers_equal(g_num, p_num, rel_tolerance)
    )
    if num_equal and not always_mv:
        return CORRECT
    try:
        gold_parsed = _parse_gold(gold, timeout_s)
        if g_num is None and (not gold_parsed or looks_like_text(gold)):
            return ItemResult(
                None, "invalid_reference", f"reference {gold[:64]!r} is not a math value"
            )
        pred_parsed = _parse(pred, timeout_s, gold=False) if gold_parsed else []
        mv_equal = bool(pred_parsed) and _mv_equal(gold_parsed, pred_parsed, timeout_s)
        return CORRECT if mv_equal or num_equal else WRONG
    except _ItemTimeout as exc:
        if numeric:  # both plain numbers: their comparison stands
            return CORRECT if num_equal else WRONG
        return ItemResult(None, "timeout", f"{exc} (limit {timeout_s}s per step)")
    except RecursionError:
        return ItemResult(None, "internal", "expression too deeply nested")


def worker_main(conn: Connection, shared: Any, timeout_s: int) -> None:
    """Serve chunks until the socket closes or ``None`` arrives."""
    # The parent coordinates shutdown: ignore Ctrl-C's SIGINT, die on SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.freeze()  # the preloaded sympy/math-verify heap: out of every full collection's walk
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        chunk_id, items, flush_at = msg
        first = 0  # index of the first result not sent yet
        results: list[ItemResult] = []
        seconds: list[float] = []  # each item's time, for the pool's fair share
        for i, (gold, pred, rel_tol, always_mv) in enumerate(items):
            if i and shared[YIELD]:  # hand the rest back (see pool.py)
                break
            if i in flush_at and results:  # another request's items start: send these
                conn.send((chunk_id, first, results, seconds, False))
                first, results, seconds = i, [], []
            started = time.monotonic()
            shared[STARTED] = started  # start time first, then the index
            shared[RUNNING] = float(i)
            try:
                results.append(score_item(gold, pred, rel_tol, timeout_s, always_mv))
            except Exception as exc:  # never let one item take the worker down
                results.append(ItemResult.failed(exc))
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
    for gold, pred in (("5", "\\sqrt{25}"), ("x+1", "1+x"), ("\\frac{1}{2}", "0.5"), ("3", "3!")):
        score_item(gold, pred, 1e-6, 5, True)
