"""The verify service's work: ``math_accuracy`` and ``format`` over component requests.

Importable without FastAPI. ``Verifier`` is built once at start-up (it owns the worker
pool). Extraction and the numeric fast path run here, in the service process (linear-time
scans, bounded number sizes); everything that needs math-verify goes to the pool.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import math
import time
from dataclasses import dataclass

from prometheus_client import Counter

from arbiter.errors import ItemResult, PayloadTooLarge
from arbiter.proto.components import (
    ComponentGroupResult,
    ComponentResponse,
    ComponentUsage,
)
from arbiter.proto.errors import ItemError
from arbiter.proto.verify import FormatRequest, MathRequest
from arbiter.services.verify.extract import (
    INFO_CHARS,
    Extraction,
    Number,
    extract_answer,
    long_integer,
    numbers_equal,
    reference_value,
    to_number,
)
from arbiter.services.verify.formatting import format_score
from arbiter.services.verify.pool import WorkerPool
from arbiter.services.verify.settings import VerifySettings
from arbiter.services.verify.worker import CORRECT, WRONG, Item, score_item

log = logging.getLogger("arbiter.verify")

ITEMS = Counter(
    "verify_items_total", "Items scored, by component and outcome.", ["component", "outcome"]
)
ITEM_ERRORS = Counter("verify_item_errors_total", "Null scores, by error kind.", ["kind"])
PATHS = Counter(
    "verify_math_path_total",
    "How math items were decided: fast_path (numbers, in-process), pool (math-verify), "
    "no_answer, conflict.",
    ["path"],
)

# The labelled children, looked up once: ``labels()`` costs more than the fast path's
# comparison itself, and it ran several times per item.
_PATH = {p: PATHS.labels(p) for p in ("fast_path", "pool", "no_answer", "conflict")}
_MATH_OUTCOME = {o: ITEMS.labels("math_accuracy", o) for o in ("correct", "wrong", "null")}
_FORMAT_OUTCOME = {o: ITEMS.labels("format", o) for o in ("correct", "wrong", "null")}

# Slack on top of the per-item deadlines before a request gives up on queued items.
_REQUEST_SLACK_S = 30.0


NO_REFERENCE = ItemResult(None, "invalid_reference", "no reference value given")
POOL_LATE = ItemResult(None, "timeout", "not scored in time: the pool is overloaded or down")


@dataclass
class _Slot:
    """One response's result while a request is being assembled."""

    result: ItemResult = NO_REFERENCE
    pending: int = -1  # index into the request's pool futures, or -1


def _outcome(score: float | None) -> str:
    if score is None:
        return "null"
    return "correct" if score == 1.0 else "wrong"


def plan_item(
    response: str, gold: str, g_num: Number | None, rel_tol: float, fast: bool
) -> tuple[Extraction, str, float | Item]:
    """Extract the response's answer; decide it here (a score) or hand it on (a pool item).
    The middle value is how (a ``verify_math_path_total`` label)."""
    ex = extract_answer(response)
    if ex.status != "ok":
        return ex, "conflict" if ex.status == "conflict" else "no_answer", 0.0
    p_num = to_number(ex.text) if fast and g_num is not None else None
    if g_num is not None and p_num is not None:
        return ex, "fast_path", 1.0 if numbers_equal(g_num, p_num, rel_tol) else 0.0
    if fast and g_num is not None and g_num.value.denominator == 1 and not g_num.percent:
        digits = long_integer(ex.text)  # integers compare exactly, whatever their length
        if digits is not None:
            return ex, "fast_path", 1.0 if digits == str(g_num.value.numerator) else 0.0
    return ex, "pool", (gold, ex.text, rel_tol, not fast)


def score_math_direct(
    response: str, reference: str | None, rel_tol: float = 1e-6, timeout_s: int = 5
) -> ItemResult:
    """The whole math_accuracy rule for one response, in this process (tests, benchmarks).

    Same result as the service, minus the wall-clock deadline: call it from the main
    thread (math-verify's timeouts use ``signal.alarm``).
    """
    gold = reference_value(reference)
    if gold is None:
        return NO_REFERENCE
    g_num = to_number(gold)
    if g_num is None:
        check = score_item(gold, gold, rel_tol, timeout_s, True)
        if check.score is None:
            return check
    _, _, decided = plan_item(response, gold, g_num, rel_tol, True)
    if isinstance(decided, float):
        return ItemResult(decided)
    return score_item(*decided[:3], timeout_s, decided[3])


class Verifier:
    def __init__(self, settings: VerifySettings) -> None:
        self.settings = settings
        self.pool = WorkerPool(
            size=settings.workers,
            deadline_s=settings.deadline_s,
            mv_timeout_s=settings.mv_timeout,
            max_chunk=settings.max_chunk,
            start_method=settings.start_method,
        )

    async def start(self) -> None:
        await self.pool.start()
        # math-verify and sympy (imported with the worker's code) leave ~120,000 long-lived
        # objects in this process; frozen, a full collection no longer walks them (it took
        # tens of milliseconds, a whole batch's worth of work, every few hundred requests).
        gc.freeze()

    async def close(self) -> None:
        await self.pool.close()

    def ready(self) -> dict[str, str]:
        alive, size = self.pool.alive, self.pool.size
        return {"pool": "ok" if alive == size else f"{alive}/{size} math workers alive"}

    # ------------------------------------------------------------------ math_accuracy

    async def math(self, req: MathRequest) -> ComponentResponse:
        start = time.perf_counter()
        n_items = sum(len(g.responses) for g in req.groups)
        if n_items > self.settings.max_items:
            raise PayloadTooLarge(
                f"{n_items} responses in one request; the limit is {self.settings.max_items} "
                "(VERIFY_MAX_ITEMS): split the request",
                param="groups",
                code="too_many_items",
            )
        rel_tol = req.params.rel_tolerance
        fast = self.settings.fast_path
        items: list[Item] = []
        # Counted per request, not per item: a metric's inc costs as much as the fast path.
        paths: collections.Counter[str] = collections.Counter()
        outcomes: collections.Counter[str] = collections.Counter()
        groups: list[tuple[list[_Slot], int, list[str | None], list[int]]] = []
        for group in req.groups:
            gold = reference_value(group.reference)
            slots = [_Slot() for _ in group.responses]
            answers: list[str | None] = [None] * len(slots)
            conflicts: list[int] = []
            ref_check = -1
            if gold is None:  # every slot keeps NO_REFERENCE
                groups.append((slots, ref_check, answers, conflicts))
                continue
            g_num = to_number(gold)
            if g_num is None:  # only math-verify can tell whether this reference parses
                ref_check = len(items)
                items.append((gold, gold, rel_tol, True))
            for i, response in enumerate(group.responses):
                ex, path, decided = plan_item(response, gold, g_num, rel_tol, fast)
                paths[path] += 1
                slot = slots[i]
                if ex.status == "conflict":
                    conflicts.append(i)
                if ex.status == "ok":
                    answers[i] = ex.text.strip()[:INFO_CHARS]
                if isinstance(decided, float):
                    slot.result = CORRECT if decided == 1.0 else WRONG
                    continue
                slot.pending = len(items)
                items.append(decided)
            groups.append((slots, ref_check, answers, conflicts))

        results = await self._run(items)
        out: list[ComponentGroupResult] = []
        for group, (slots, ref_check, answers, conflicts) in zip(req.groups, groups, strict=True):
            ref_error = None
            if ref_check >= 0 and results[ref_check].score is None:
                ref_error = results[ref_check]
            scores: list[float | None] = []
            errors: list[ItemError] = []
            for i, slot in enumerate(slots):
                result = slot.result
                if ref_error is not None:
                    result = ref_error
                elif slot.pending >= 0:
                    result = results[slot.pending]
                error = result.error(i)
                if error is not None:
                    errors.append(error)
                    ITEM_ERRORS.labels(error.kind).inc()
                scores.append(result.score)
                outcomes[_outcome(result.score)] += 1
            info: dict[str, object] = {"answers": answers}
            if conflicts:
                info["conflicts"] = conflicts
            out.append(ComponentGroupResult(id=group.id, scores=scores, errors=errors, info=info))
        for path, n in paths.items():
            _PATH[path].inc(n)
        for outcome, n in outcomes.items():
            _MATH_OUTCOME[outcome].inc(n)
        return ComponentResponse(
            component="math_accuracy",
            groups=out,
            usage=ComponentUsage(items=n_items, elapsed_ms=(time.perf_counter() - start) * 1e3),
        )

    async def _run(self, items: list[Item]) -> list[ItemResult]:
        """Score items in the pool; never waits past a bound, whatever the pool does."""
        if not items:
            return []
        ticket = self.pool.submit(items)
        futures = ticket.futures
        waves = math.ceil((len(items) + self.pool.queued) / max(1, self.pool.size))
        bound = waves * self.settings.deadline_s * 2 + _REQUEST_SLACK_S
        try:
            _, pending = await asyncio.wait(futures, timeout=bound)
        except asyncio.CancelledError:  # the client left: its items leave the pool
            self.pool.cancel(ticket)
            raise
        if pending:
            self.pool.cancel(ticket)
        if pending:
            log.error("%d math items still queued after %.0f s", len(pending), bound)
        return [f.result() if f.done() and not f.cancelled() else POOL_LATE for f in futures]

    # ------------------------------------------------------------------ format

    def format(self, req: FormatRequest) -> ComponentResponse:
        start = time.perf_counter()
        out: list[ComponentGroupResult] = []
        n_items = 0
        for group in req.groups:
            scores: list[float | None] = [format_score(r, req.params) for r in group.responses]
            n_items += len(scores)
            for s in scores:
                _FORMAT_OUTCOME[_outcome(s)].inc()
            out.append(ComponentGroupResult(id=group.id, scores=scores))
        return ComponentResponse(
            component="format",
            groups=out,
            usage=ComponentUsage(items=n_items, elapsed_ms=(time.perf_counter() - start) * 1e3),
        )
