"""The judge's work: build prompts, call the judge server, turn replies into scores.

``judge_quality`` asks for a rubric rating (JSON via ``response_format`` json_schema when
the server takes it) and maps overall 1..scale to [0, 1]. ``judge_verifier`` asks for a
one-token Yes/No verdict and reads p(Yes) / (p(Yes) + p(No)) from the top log-probs.
Every item is one chat completion; items run concurrently, at most
``JUDGE_MAX_CONCURRENCY`` at once, admitted by the one fair-share policy, teams first,
then each team's requests (``common.fairness.FairLimiter``, charged in calls): a team that
sends 70 requests of 1,000 items does not hold another team's items behind its own; they
wait for at most one call per other team. An item's deadline, ``JUDGE_TIMEOUT_S``,
counts from its request's arrival, waiting for a slot included. A failure nulls that item
with its kind; it never fails the batch. A cancelled request (its client went away)
leaves the line and cancels its calls in flight.

Prompt layout, for the server's prefix cache: the fixed rubric/instruction is the system
message; the user message starts with the question and reference (shared by the G
responses of a group) and ends with the response. Each team's calls carry their own
``cache_salt`` (``JUDGE_CACHE_SALT_PER_TEAM``): vLLM shares cached prefixes only between
calls with the same salt, so a team's call times say nothing about other teams' prompts.
The salt is an HMAC of the team under a key drawn at start-up: unpredictable, and the
team's name never reaches the judge server.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from arbiter.errors import ArbiterError, InvalidRequest, ItemResult, Timeout
from arbiter.proto.components import ComponentGroupResult, ComponentResponse, ScoreGroup
from arbiter.proto.components import ComponentUsage as Usage
from arbiter.proto.judge import QUALITY_DIMENSIONS, QualityParams, QualityRequest, VerifierRequest
from arbiter.services.common.fairness import FairLimiter
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.judge.client import ChatClient
from arbiter.services.judge.parsing import (
    JudgeReplyError,
    finish_reason,
    first_token_top_logprobs,
    label_probability,
    message_text,
    parse_quality,
    usage_tokens,
)
from arbiter.services.judge.settings import JudgeSettings

log = logging.getLogger("arbiter.judge")
READY_LOG = ThrottledLog(log)  # probes come every few seconds: one line per 10 s when down

ITEMS = Counter(
    "arbiter_judge_items_total", "Scored items by component and outcome.", ["component", "outcome"]
)
LABELS = ("Yes", "No")
PROBE_PROMPT = "Answer with one word, Yes or No: is 2 + 2 = 4?"


@dataclass
class _Probe:
    ok_until: float = 0.0
    last: str = "not probed yet"
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def user_message(group: ScoreGroup, response: str, show_reference: bool) -> str:
    parts = [f"Question:\n{group.prompt}"]
    if show_reference and group.reference:
        parts.append(f"Reference answer:\n{group.reference}")
    parts.append(f"Response:\n{response}")
    return "\n\n".join(parts)


def quality_schema(scale: int) -> dict[str, Any]:
    rating = {"type": "integer", "minimum": 1, "maximum": scale}
    return {
        "type": "object",
        "properties": {d: rating for d in QUALITY_DIMENSIONS},
        "required": list(QUALITY_DIMENSIONS),
        "additionalProperties": False,
    }


def _refuses_structured_output(exc: InvalidRequest) -> bool:
    text = str(exc).lower()
    return exc.status == 400 and any(w in text for w in ("response_format", "json_schema"))


class Judge:
    """Built once per process (lifespan) and kept on ``app.state.judge``."""

    def __init__(self, settings: JudgeSettings, client: ChatClient | None = None):
        self.settings = settings
        self.client = client or ChatClient(settings)
        self._slots = FairLimiter(settings.max_concurrency, settings.team_weights)
        self._json_refused = False
        self._probe = _Probe()
        self._salt_key = secrets.token_bytes(32)  # per process: salts nobody can predict

    async def aclose(self) -> None:
        await self.client.aclose()

    def cache_salt(self, team: str) -> dict[str, Any]:
        """``{"cache_salt": …}`` for ``team``'s calls (empty when the setting is off)."""
        if not self.settings.cache_salt_per_team:
            return {}
        digest = hmac.new(self._salt_key, team.encode(), hashlib.sha256).digest()
        return {"cache_salt": base64.urlsafe_b64encode(digest).decode().rstrip("=")}

    def _thinking(self) -> dict[str, Any]:
        if not self.settings.send_thinking_switch:
            return {}
        return {"chat_template_kwargs": {"enable_thinking": self.settings.enable_thinking}}

    # ----------------------------------------------------------------------- payloads

    def quality_payload(
        self,
        group: ScoreGroup,
        response: str,
        params: QualityParams,
        structured: bool,
        team: str = "",
    ) -> dict[str, Any]:
        system = params.rubric.replace("{scale}", str(params.scale))
        user = user_message(group, response, params.show_reference)
        payload: dict[str, Any] = {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user + "\n\nReply with the JSON object only."},
            ],
            "temperature": params.temperature,
            "max_tokens": params.max_tokens,
            **self._thinking(),
            **self.cache_salt(team),
        }
        if structured:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "judge_quality",
                    "schema": quality_schema(params.scale),
                    "strict": True,
                },
            }
        return payload

    def verifier_payload(
        self, group: ScoreGroup, response: str, req: VerifierRequest, team: str = ""
    ) -> dict[str, Any]:
        p = req.params
        top = p.top_logprobs or self.settings.top_logprobs
        constrain = (
            self.settings.constrain_labels if p.constrain_labels is None else p.constrain_labels
        )
        user = user_message(group, response, p.show_reference)
        payload: dict[str, Any] = {
            "messages": [
                {"role": "system", "content": p.instruction},
                {"role": "user", "content": user + "\n\nIs the response correct? Yes or No."},
            ],
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": top,
            **self._thinking(),
            **self.cache_salt(team),
        }
        if constrain:
            payload["structured_outputs"] = {"choice": list(LABELS)}
        return payload

    # ----------------------------------------------------------------------- items

    def _structured(self) -> bool:
        mode = self.settings.structured_output
        return mode == "json_schema" or (mode == "auto" and not self._json_refused)

    async def _quality_item(
        self, group: ScoreGroup, response: str, team: str, params: QualityParams
    ) -> ItemResult:
        structured = self._structured()
        try:
            try:
                body = await self.client.chat(
                    self.quality_payload(group, response, params, structured, team),
                    "judge_quality",
                )
            except InvalidRequest as exc:
                if not (structured and self.settings.structured_output == "auto"):
                    raise
                if not _refuses_structured_output(exc):
                    raise
                if not self._json_refused:
                    log.warning("judge server refuses response_format (%s); parsing text", exc)
                self._json_refused = True
                structured = False
                body = await self.client.chat(
                    self.quality_payload(group, response, params, False, team), "judge_quality"
                )
            pt, ct = usage_tokens(body)
            try:
                cut = finish_reason(body) == "length"
                verdict = parse_quality(message_text(body), params.scale, cut)
            except JudgeReplyError as exc:
                return self._failed("judge_quality", exc, pt, ct)
        except ArbiterError as exc:
            return self._failed("judge_quality", exc)
        ITEMS.labels("judge_quality", "ok").inc()
        info = {**verdict.dimensions, "source": verdict.source if not structured else "json_schema"}
        return ItemResult(verdict.score, None, "", info, pt, ct)

    async def _verifier_item(
        self, group: ScoreGroup, response: str, team: str, req: VerifierRequest
    ) -> ItemResult:
        try:
            body = await self.client.chat(
                self.verifier_payload(group, response, req, team), "judge_verifier"
            )
            pt, ct = usage_tokens(body)
            try:
                verdict = label_probability(first_token_top_logprobs(body))
            except JudgeReplyError as exc:
                return self._failed("judge_verifier", exc, pt, ct)
        except ArbiterError as exc:
            return self._failed("judge_verifier", exc)
        ITEMS.labels("judge_verifier", "ok").inc()
        info = {"logprob_yes": verdict.logprob_yes, "logprob_no": verdict.logprob_no}
        return ItemResult(verdict.p_yes, None, "", info, pt, ct)

    @staticmethod
    def _failed(component: str, exc: ArbiterError, pt: int = 0, ct: int = 0) -> ItemResult:
        ITEMS.labels(component, exc.kind).inc()
        return ItemResult.failed(exc, pt, ct)

    # ----------------------------------------------------------------------- batches

    async def _run(
        self, component: str, team: str, groups: list[ScoreGroup], item: Any, *extra: Any
    ) -> ComponentResponse:
        start = time.perf_counter()
        request = object()  # this request's key in the fair line
        deadline = asyncio.get_running_loop().time() + self.settings.timeout_s

        async def fair(g: ScoreGroup, r: str) -> ItemResult:
            try:
                async with asyncio.timeout_at(deadline), self._slots.slot(request, team):
                    result: ItemResult = await item(g, r, team, *extra)
                    return result
            except TimeoutError:  # past the item's deadline, waiting for a slot included
                message = f"not judged within {self.settings.timeout_s:g}s (queueing included)"
                return self._failed(component, Timeout(message))

        flat = await asyncio.gather(*(fair(g, r) for g in groups for r in g.responses))
        out, usage, k = [], Usage(items=len(flat)), 0
        for g in groups:
            results: list[ItemResult] = list(flat[k : k + len(g.responses)])
            k += len(g.responses)
            usage.prompt_tokens += sum(r.prompt_tokens for r in results)
            usage.completion_tokens += sum(r.completion_tokens for r in results)
            out.append(
                ComponentGroupResult(
                    id=g.id,
                    scores=[r.score for r in results],
                    errors=[e for i, r in enumerate(results) if (e := r.error(i)) is not None],
                    info={"judge": [r.info for r in results]},
                )
            )
        usage.elapsed_ms = (time.perf_counter() - start) * 1000
        return ComponentResponse(component=component, groups=out, usage=usage)

    async def quality(self, req: QualityRequest, team: str = "") -> ComponentResponse:
        """``team`` (the gateway's internal header): whose fair share of the slots."""
        return await self._run("judge_quality", team, req.groups, self._quality_item, req.params)

    async def verifier(self, req: VerifierRequest, team: str = "") -> ComponentResponse:
        return await self._run("judge_verifier", team, req.groups, self._verifier_item, req)

    # ----------------------------------------------------------------------- readiness

    async def readiness(self) -> dict[str, str]:
        """Server reachable, model listed, and log-probs honoured (a probe, cached on pass)."""
        s = self.settings
        try:
            models = await self.client.list_models()
        except Exception as exc:
            # /readyz is unauthenticated: say that the judge server is down, not where (the
            # log has the address and the error; JUDGE_BASE_URL is the setting to check)
            READY_LOG.warning("down", "judge server not ready at %s: %s", s.base_url, exc)
            reason = f"unreachable ({type(exc).__name__}); see the judge's log and JUDGE_BASE_URL"
            return {"judge_server": reason, "model": "not checked", "logprobs": "not checked"}
        checks = {"judge_server": "ok"}
        if s.model and s.model not in models:
            checks["model"] = f"{s.model!r} is not served; the server lists {models}"
        elif not models:
            checks["model"] = "the server lists no models"
        else:
            checks["model"] = "ok"
        if checks["model"] != "ok":
            checks["logprobs"] = "not checked"
            return checks
        checks["logprobs"] = await self._probe_logprobs()
        return checks

    async def _probe_logprobs(self) -> str:
        probe = self._probe
        async with probe.lock:
            if time.monotonic() < probe.ok_until:
                return "ok"
            k = self.settings.top_logprobs
            payload = {
                "messages": [{"role": "user", "content": PROBE_PROMPT}],
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": True,
                "top_logprobs": k,
                **self._thinking(),
            }
            try:
                body = await self.client.chat(
                    payload, "readiness_probe", timeout_s=min(15.0, self.settings.timeout_s)
                )
                top = first_token_top_logprobs(body)
            except InvalidRequest as exc:
                probe.last = (
                    f"the server refused a log-probs request with top_logprobs={k} ({exc}); "
                    "start vLLM with --max-logprobs >= JUDGE_TOP_LOGPROBS or lower it"
                )
            except ArbiterError as exc:
                probe.last = f"log-probs probe failed ({exc.kind}): {exc}"
                if exc.kind == "judge_unsupported":
                    probe.last = (
                        f"the judge server ignores logprobs: {exc}; judge_verifier needs a "
                        "server that returns top_logprobs (vLLM does; `transformers serve` "
                        "does not)"
                    )
            else:
                if len(top) >= min(k, 5):
                    probe.ok_until = time.monotonic() + self.settings.ready_probe_ttl_s
                    probe.last = "ok"
                else:
                    probe.last = f"the server returned {len(top)} top_logprobs for top_logprobs={k}"
            return probe.last
