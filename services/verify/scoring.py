"""The verify service's work: ``math_accuracy`` and ``format`` over component requests.

Importable without FastAPI. ``Verifier`` is built once at start-up (it owns the worker
pool). The math rule runs in the pool's workers, every response of it (extraction, the
numeric fast path, math-verify for the rest: worker.py); this process only reads each
group's reference, queues the responses and assembles the answer.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import math
import time

from prometheus_client import Counter

from arbiter.errors import ItemResult, PayloadTooLarge
from arbiter.proto.components import (
    ComponentGroupResult,
    ComponentResponse,
    ComponentUsage,
)
from arbiter.proto.errors import ItemError
from arbiter.proto.verify import FormatRequest, MathRequest
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.verify.extract import reference_value
from arbiter.services.verify.formatting import format_score
from arbiter.services.verify.pool import WorkerPool
from arbiter.services.verify.settings import VerifySettings
from arbiter.services.verify.worker import Item, Scored, score_response

log = logging.getLogger("arbiter.verify")
LATE_LOG = ThrottledLog(log)  # an overloaded pool fails every request alike: one line per 10 s

ITEMS = Counter(
    "verify_items_total", "Items scored, by component and outcome.", ["component", "outcome"]
)
ITEM_ERRORS = Counter("verify_item_errors_total", "Null scores, by error kind.", ["kind"])
PATHS = Counter(
    "verify_math_path_total",
    "How math items were decided: fast_path (plain numbers, without math-verify), "
    "math_verify, text (a word answer such as \\text{odd}), no_answer, conflict, no_reference, "
    "failed (the worker died or overran the "
    "deadline).",
    ["path"],
)

# The labelled children, looked up once: ``labels()`` costs more than the fast path's
# comparison itself, and it ran several times per item.
_PATH = {
    p: PATHS.labels(p)
    for p in ("fast_path", "math_verify", "text", "no_answer", "conflict", "no_reference", "failed")
}
_MATH_OUTCOME = {o: ITEMS.labels("math_accuracy", o) for o in ("correct", "wrong", "null")}
_FORMAT_OUTCOME = {o: ITEMS.labels("format", o) for o in ("correct", "wrong", "null")}

# Slack on top of the per-item deadlines before a request gives up on queued items.
_REQUEST_SLACK_S = 30.0


NO_REFERENCE = ItemResult(None, "invalid_reference", "no reference value given")
_NO_REFERENCE: Scored = (NO_REFERENCE, "no_reference", None)
POOL_LATE: Scored = (
    ItemResult(None, "timeout", "not scored in time: the pool is overloaded or down"),
    "failed",
    None,
)


def _outcome(score: float | None) -> str:
    if score is None:
        return "null"
    return "correct" if score == 1.0 else "wrong"


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
    return score_response(response, gold, rel_tol, timeout_s)[0]


class Verifier:
    def __init__(self, settings: VerifySettings) -> None:
        self.settings = settings
        self.pool = WorkerPool(
            size=settings.workers,
            deadline_s=settings.deadline_s,
            mv_timeout_s=settings.mv_timeout,
            max_chunk=settings.max_chunk,
            start_method=settings.start_method,
            nice=settings.worker_nice,
            team_weights=settings.team_weights,
        )

    async def start(self) -> None:
        await self.pool.start()
        # math-verify and sympy (imported with the worker's code) leave ~120,000 long-lived
        # objects in this process. Frozen, a full collection skips them: walking them takes
        # tens of milliseconds, a whole batch's worth of work, every few hundred requests.
        gc.freeze()

    async def close(self) -> None:
        await self.pool.close()

    def ready(self) -> dict[str, str]:
        alive, size = self.pool.alive, self.pool.size
        return {"pool": "ok" if alive == size else f"{alive}/{size} math workers alive"}

    # ------------------------------------------------------------------ math_accuracy

    async def math(self, req: MathRequest, team: str = "") -> ComponentResponse:
        """``team`` (the gateway's internal header): whose fair share of the pool the items
        take, and whose reference caches they use."""
        start = time.perf_counter()
        n_items = sum(len(g.responses) for g in req.groups)
        if n_items > self.settings.max_items:
            raise PayloadTooLarge(
                f"{n_items} responses in one request; the limit is {self.settings.max_items} "
                "(VERIFY_MAX_ITEMS): split the request",
                param="groups",
                code="too_many_items",
            )
        rel_tol, fast = req.params.rel_tolerance, self.settings.fast_path
        items: list[Item] = []
        golds = [reference_value(group.reference) for group in req.groups]
        for group, gold in zip(req.groups, golds, strict=True):
            if gold is not None:  # else every response: NO_REFERENCE
                items.extend((response, gold, rel_tol, fast, team) for response in group.responses)

        results = iter(await self._run(items, team))
        # Counted per request, not per item: a metric's inc costs as much as the fast path.
        paths: collections.Counter[str] = collections.Counter()
        outcomes: collections.Counter[float | None] = collections.Counter()
        out: list[ComponentGroupResult] = []
        for group, gold in zip(req.groups, golds, strict=True):
            scores: list[float | None] = []
            errors: list[ItemError] = []
            answers: list[str | None] = []
            conflicts: list[int] = []
            for i in range(len(group.responses)):
                result, path, answer = _NO_REFERENCE if gold is None else next(results)
                paths[path] += 1
                answers.append(answer)
                score = result.score
                scores.append(score)
                outcomes[score] += 1
                if score is None and (error := result.error(i)) is not None:
                    errors.append(error)
                if path == "conflict":
                    conflicts.append(i)
            info: dict[str, object] = {"answers": answers}
            if conflicts:
                info["conflicts"] = conflicts
            out.append(ComponentGroupResult(id=group.id, scores=scores, errors=errors, info=info))
        for path, k in paths.items():
            _PATH[path].inc(k)
        for error in (e for g in out for e in g.errors):
            ITEM_ERRORS.labels(error.kind).inc()
        for score, k in outcomes.items():
            _MATH_OUTCOME[_outcome(score)].inc(k)
        return ComponentResponse(
            component="math_accuracy",
            groups=out,
            usage=ComponentUsage(items=n_items, elapsed_ms=(time.perf_counter() - start) * 1e3),
        )

    async def _run(self, items: list[Item], team: str) -> list[Scored]:
        """Score items in the pool; never waits past a bound, whatever the pool does."""
        if not items:
            return []
        ticket = self.pool.submit(items, team)
        waves = math.ceil((len(items) + self.pool.queued) / max(1, self.pool.size))
        bound = waves * self.settings.deadline_s * 2 + _REQUEST_SLACK_S
        try:
            await asyncio.wait({ticket.done}, timeout=bound)
        except asyncio.CancelledError:  # the client left: its items leave the pool
            self.pool.cancel(ticket)
            raise
        if not ticket.done.done():
            self.pool.cancel(ticket)
            LATE_LOG.error("late", "%d math items still queued after %.0f s", ticket.left, bound)
        return [POOL_LATE if r is None else r for r in ticket.results]

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
