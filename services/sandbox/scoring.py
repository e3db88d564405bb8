"""The sandbox service's work: ``code_tests`` and ``python_grader`` over component requests.

Importable without FastAPI. ``Runner`` is built once at start-up (it owns the pool of
started sandboxes). Each response is one job in one sandbox: its program against all of
its group's tests, or the grader once. At most ``SANDBOX_WORKERS`` jobs run at once,
admitted by the one fair-share policy, teams first, then each team's requests
(``common.fairness.FairLimiter``, charged in programs): another team's response waits for
at most one job per other team. A cancelled request (its client left) leaves the line and
kills its running sandboxes.

What is whose fault. The response's own failures (a syntax error, an exception, a
timeout, memory, the output limit, a fork bomb) fail the tests they hit and score what
passed; the per-test reason is in the group's ``info``. A grader's failure (it raised,
overran, or returned something other than a finite number) is null ``grader_error``. Only
the sandbox's own failures (it could not start, or died without answering) are null
``sandbox_error``; a response that waited past ``SANDBOX_QUEUE_TIMEOUT_S`` for a sandbox
is null ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from arbiter.errors import PayloadTooLarge
from arbiter.proto.components import ComponentGroupResult, ComponentResponse, ComponentUsage
from arbiter.proto.errors import ErrorKind, ItemError
from arbiter.proto.sandbox import CodeTestsRequest, PythonGraderRequest
from arbiter.services.common.fairness import FairLimiter
from arbiter.services.sandbox import grader
from arbiter.services.sandbox.assemble import Wanted, extract_program, wanted
from arbiter.services.sandbox.injail.runners import output_digest
from arbiter.services.sandbox.jail import Pool, SandboxFailure
from arbiter.services.sandbox.packages import JAIL_SITE
from arbiter.services.sandbox.programs import ReferenceError_, TestPlan, parse_reference
from arbiter.services.sandbox.settings import SandboxSettings

log = logging.getLogger("arbiter.sandbox")

ITEMS = Counter(
    "sandbox_items_total", "Responses run, by component and outcome.", ["component", "outcome"]
)
JOB_SECONDS = Histogram(
    "sandbox_job_seconds",
    "Wall time of one job in its sandbox (all of a response's tests).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
CPU_SECONDS = Counter("sandbox_cpu_seconds_total", "CPU time the programs used.", ["component"])

OFFLOAD_CHARS = 8192  # a response this long is assembled on a worker thread (assemble.py)
SLACK_S = 5.0  # the backstop over a job's own deadline, for the harness to answer


@dataclass
class Outcome:
    """One response's result: its score (or None and why) and its notes."""

    score: float | None
    kind: ErrorKind | None = None
    message: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    cpu_s: float = 0.0


class Runner:
    """Built once per process (lifespan), kept on ``app.state.runner``."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self.pool = Pool(settings, settings.workers + settings.spare)
        self.slots = FairLimiter(settings.workers, settings.team_weights)

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    def ready(self) -> dict[str, str]:
        error = self.pool.last_error
        # the last start failed (none since succeeded): not ready to run programs
        return {"sandbox": f"sandboxes fail to start: {error}" if error else "ok"}

    def limits(self) -> dict[str, Any]:
        s = self.settings
        return {
            "memory_mb": s.memory_mb,
            "processes": s.max_processes,
            "file_mb": s.max_file_mb,
            "open_files": s.max_open_files,
            "nice": s.nice,
        }

    def _job(self, timeout_s: float, **job: Any) -> dict[str, Any]:
        s = self.settings
        return {
            "item_timeout_s": s.item_timeout_s,
            "output_limit": s.output_limit_bytes,
            "timeout_s": min(timeout_s, s.test_timeout_s),
            "limits": self.limits(),
            "no_dump": self.pool.seccomp is None,
            **job,
        }

    def _check_size(self, groups: list[Any]) -> None:
        n = sum(len(g.responses) for g in groups)
        if n > self.settings.max_items:
            raise PayloadTooLarge(
                f"{n} responses in one request; the limit is {self.settings.max_items} "
                "(SANDBOX_MAX_ITEMS): split the request",
                param="groups",
                code="too_many_items",
            )

    # ------------------------------------------------------------------ code_tests

    async def code_tests(self, req: CodeTestsRequest, team: str = "") -> ComponentResponse:
        self._check_size(req.groups)
        p = req.params
        plans: list[tuple[TestPlan, Wanted] | str] = []
        for g in req.groups:
            try:
                plan = parse_reference(
                    g.reference, g.prompt, p.entry_point, self.settings.max_tests
                )
            except ReferenceError_ as exc:
                plans.append(str(exc))
                continue
            want = wanted(g.reference, g.prompt, p.entry_point, plan.kind == "stdio")
            plans.append((plan, want))

        async def one(planned: tuple[TestPlan, Wanted] | str, response: str) -> Outcome:
            if isinstance(planned, str):
                return Outcome(None, "invalid_reference", planned)
            plan, want = planned
            if len(response) < OFFLOAD_CHARS:
                program = extract_program(response, want)
            else:  # parsing 100k characters takes ~0.1 s: off the event loop
                program = await asyncio.to_thread(extract_program, response, want)
            job = self._job(
                p.timeout_s,
                program=program,
                stop_on_fail=p.mode == "all",
                **plan.job(),
            )
            answer = await self._run_job(job)
            if isinstance(answer, Outcome):
                return answer
            if plan.kind == "stdio":
                _judge_outputs(answer, plan)
            return _tests_outcome(answer, plan.n_tests, p.mode)

        items = [(plan, r) for plan, g in zip(plans, req.groups, strict=True) for r in g.responses]
        return await self._score("code_tests", team, req.groups, items, one)

    # ------------------------------------------------------------------ python_grader

    async def python_grader(self, req: PythonGraderRequest, team: str = "") -> ComponentResponse:
        self._check_size(req.groups)
        p = req.params
        # its packages reserve more address space than a program needs (packages.py)
        limits = {**self.limits(), "memory_mb": self.settings.grader_memory_mb}

        async def one(item: dict[str, Any], response: str) -> Outcome:
            job = self._job(
                p.timeout_s,
                kind="grader",
                source=p.source,
                sample=grader.sample(response),
                item=item,
                import_path=[JAIL_SITE],
                limits=limits,
            )
            answer = await self._run_job(job)
            if isinstance(answer, Outcome):
                return answer
            cpu = float(answer.get("cpu_s", 0.0))
            if answer.get("wall"):
                return _wall_outcome(answer, cpu)
            score = answer.get("score")
            if isinstance(score, float):
                why = grader.out_of_range(score, p.score_range)
                if why is None:
                    return Outcome(score, cpu_s=cpu)
                return Outcome(None, "grader_error", why, cpu_s=cpu)
            reason = str(answer.get("error") or "grade gave no result")[:500]
            return Outcome(None, "grader_error", reason, cpu_s=cpu)

        items = [
            (grader.item(g.prompt, g.reference, p.metadata, g.metadata), r)
            for g in req.groups
            for r in g.responses
        ]
        return await self._score("python_grader", team, req.groups, items, one)

    # ------------------------------------------------------------------ shared

    async def _run_job(self, job: dict[str, Any]) -> dict[str, Any] | Outcome:
        """Run ``job`` in a started sandbox: its answer, or the sandbox's own failure."""
        start = time.perf_counter()
        try:
            return await self.pool.run(job, self.settings.item_timeout_s + SLACK_S)
        except SandboxFailure as exc:
            return Outcome(None, "sandbox_error", str(exc))
        finally:
            JOB_SECONDS.observe(time.perf_counter() - start)

    async def _score(
        self,
        component: str,
        team: str,
        groups: list[Any],
        items: list[tuple[Any, str]],
        one: Callable[[Any, str], Awaitable[Outcome]],
    ) -> ComponentResponse:
        start = time.perf_counter()
        request = object()  # this request's key in the fair line
        queue_s = self.settings.queue_timeout_s

        async def fair(arg: Any, response: str) -> Outcome:
            try:
                async with asyncio.timeout(queue_s) as waiting:
                    async with self.slots.slot(request, team):
                        waiting.reschedule(None)  # running: the job's own deadlines hold
                        return await one(arg, response)
            except TimeoutError:
                return Outcome(None, "timeout", f"no sandbox free within {queue_s:g}s")

        outcomes = await asyncio.gather(*(fair(a, r) for a, r in items))
        out, k, cpu = [], 0, 0.0
        for g in groups:
            mine = outcomes[k : k + len(g.responses)]
            k += len(g.responses)
            errors = [
                ItemError(index=i, kind=o.kind or "internal", message=o.message)
                for i, o in enumerate(mine)
                if o.score is None
            ]
            for o in mine:
                cpu += o.cpu_s
                ITEMS.labels(component, _label(o)).inc()
            info = _group_info(mine) if component == "code_tests" else {}
            out.append(
                ComponentGroupResult(
                    id=g.id, scores=[o.score for o in mine], errors=errors, info=info
                )
            )
        CPU_SECONDS.labels(component).inc(cpu)
        usage = ComponentUsage(
            items=len(items),
            elapsed_ms=(time.perf_counter() - start) * 1000,
            cpu_ms=round(cpu * 1000, 3),
        )
        return ComponentResponse(component=component, groups=out, usage=usage)


def _label(o: Outcome) -> str:
    if o.score is None:
        return o.kind or "internal"
    return "passed" if o.score == 1.0 else "scored"


def _judge_outputs(answer: dict[str, Any], plan: TestPlan) -> None:
    """A stdio test that ran to a clean exit comes back as ``[null, <digest of its
    stdout>]``: it passed when that is the digest of the expected output."""
    results = answer.get("results")
    if not isinstance(results, list) or len(results) != len(plan.cases):
        return
    for i, (r, case) in enumerate(zip(results, plan.cases, strict=True)):
        if isinstance(r, list) and len(r) == 2 and r[0] is None:
            ok = r[1] == output_digest(case["output"])
            results[i] = [ok, "" if ok else "wrong output"]


def _wall_outcome(answer: dict[str, Any], cpu: float) -> Outcome:
    """The sandbox stopped a test by the wall clock while the host kept it from running,
    or the item's deadline came first: nothing the program did decided it (retryable)."""
    return Outcome(
        None,
        "timeout",
        "the program was stopped by the wall clock while the host was busy (or the "
        "response's deadline passed): not scored, retry it",
        cpu_s=cpu,
    )


def _tests_outcome(answer: dict[str, Any], n: int, mode: str) -> Outcome:
    """The score over the real tests: an entry ``null`` is an assert that made no call to
    the program (it checks nothing of it) and counts neither as passed nor as a test."""
    cpu = float(answer.get("cpu_s", 0.0))
    results = answer.get("results")
    if not isinstance(results, list) or len(results) != n:
        return Outcome(None, "sandbox_error", "the sandbox answered without every test", cpu_s=cpu)
    if answer.get("wall"):
        return _wall_outcome(answer, cpu)
    real = [(i, r) for i, r in enumerate(results) if r is not None]
    if not real:
        return Outcome(
            None,
            "invalid_reference",
            "no test of the reference calls the program: its asserts check nothing of it",
            cpu_s=cpu,
        )
    k = sum(bool(r and r[0]) for _, r in real)
    score = k / len(real) if mode == "fraction" else float(k == len(real))
    failed = {str(i): str(r[1])[:300] for i, r in real if not (r and r[0])}
    return Outcome(score, info={"passed": k, "tests": len(real), "failed": failed}, cpu_s=cpu)


def _group_info(outcomes: list[Outcome]) -> dict[str, Any]:
    """Per response: tests passed, out of how many, and each failed test's reason."""
    return {
        "passed": [o.info.get("passed") for o in outcomes],
        "tests": [o.info.get("tests") for o in outcomes],
        "failed": [o.info.get("failed", {}) for o in outcomes],
    }
