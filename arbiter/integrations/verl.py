"""verl reward functions that score through Arbiter's gateway.

verl (0.9.1) loads a custom reward function from a file and calls it with its own
keyword arguments, merged with ``reward.custom_reward_function.reward_kwargs``
(verl/trainer/ppo/reward.py, ``get_custom_reward_fn``)::

    reward:
      custom_reward_function:
        path: pkg://arbiter.integrations.verl   # verl's loader imports it by name
        name: compute_score_async               # or compute_score
        reward_kwargs: {recipe: gsm8k, base_url: "http://gateway:8000"}

- one sample (the reward loop's managers, verl/experimental/reward_loop/reward_manager/
  naive.py ``run_single``): ``compute_score(data_source=, solution_str=, ground_truth=,
  extra_info=)``;
- a batch (verl/workers/reward_manager/batch.py ``BatchRewardManager.verify``):
  ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=)``.

Each returns ``{"score": total, <component>: value, …, "arbiter_masked": 0.0 | 1.0}``
(a list of them for a batch). verl passes no group id, so samples are grouped by a key
in ``extra_info`` — the first of ``uid``, ``group``, ``index``, ``prompt``, ``question`` it
has (verl's GSM8K preprocessing writes ``index`` and ``question``) — and the group's prompt
is ``extra_info["prompt"]`` or ``["question"]``. A sample without any is scored alone
(group components such as diversity are then null).

Single samples arrive one call each, concurrently; the calls made within ``window_ms``
(default 50) of each other are sent to the gateway as one request, grouped by key, so
group components see whole groups. Prefer ``compute_score_async``: verl awaits it for
every sample of a chunk at once, while the sync one runs on verl's executor threads
(min(32, CPUs + 4)) and so only that many samples can share a window.

verl needs a number: it writes ``score`` into the reward tensor at the response's last
token, where ``None`` fails and a NaN spreads through its group's advantages into the
loss. So a masked total (could not score) becomes ``masked_score`` (default 0.0) with
``arbiter_masked`` = 1.0 beside it (verl logs it with the other keys), and a warning in the
log names the kind and its first reason (once per kind); null components become NaN. A
sample scored alone with a group component (``gsm8k-diverse``, no group key in
``extra_info``) is such a masked sample: its diversity is null (``group_too_small``).

A recipe the gateway cannot serve (a component whose service it has not configured, e.g.
``gsm8k-dj`` without a judge) is refused on the first call, before any work
(``arbiter.errors.NotConfigured``, 422, never retried): the call raises with the reason and
how to add the component, and verl stops.

Settings, from ``reward_kwargs`` or the environment: ``recipe`` (``ARBITER_RECIPE``),
``base_url`` (``ARBITER_URL``), ``api_key`` (``ARBITER_API_KEY``), ``masked_score``,
``window_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from arbiter.client import ArbiterClient
from arbiter.integrations.breakdown import breakdown
from arbiter.integrations.text import first_reason, prompt_text
from arbiter.proto.gateway import ScoreError, ScoreResponse

__all__ = ["compute_score", "compute_score_async"]

log = logging.getLogger("arbiter.integrations.verl")

GROUP_KEYS = ("uid", "group", "index", "prompt", "question")
MAX_BATCH = 1024  # samples per gateway request from the window

_CLIENTS: dict[tuple[str | None, str | None], ArbiterClient] = {}
_LOCK = threading.Lock()
_warned_kinds: set[str] = set()  # kinds of null already warned about (once per process each)


@dataclass(frozen=True)
class Settings:
    recipe: str
    base_url: str | None = None
    api_key: str | None = None
    masked_score: float = 0.0
    window_ms: float = 50.0

    @classmethod
    def from_kwargs(cls, kw: dict[str, Any]) -> Settings:
        recipe = kw.pop("recipe", None) or os.environ.get("ARBITER_RECIPE")
        if not recipe:
            raise ValueError(
                "arbiter verl reward: no recipe; set reward.custom_reward_function."
                "reward_kwargs.recipe (e.g. gsm8k) or ARBITER_RECIPE"
            )
        return cls(
            recipe=str(recipe),
            base_url=kw.pop("base_url", None),
            api_key=kw.pop("api_key", None),
            masked_score=float(kw.pop("masked_score", 0.0)),
            window_ms=float(kw.pop("window_ms", 50.0)),
        )

    def client(self) -> ArbiterClient:
        with _LOCK:
            key = (self.base_url, self.api_key)
            if key not in _CLIENTS:
                _CLIENTS[key] = ArbiterClient(self.base_url, api_key=self.api_key)
                log.info("verl rewards from the gateway at %s", _CLIENTS[key].base_url)
            return _CLIENTS[key]


@dataclass(frozen=True)
class Sample:
    key: Any  # samples with equal keys are one group; None = alone
    prompt: str
    response: str
    reference: str | None


def sample(solution_str: str, ground_truth: Any, extra_info: Any) -> Sample:
    info = extra_info if isinstance(extra_info, dict) else {}
    key = next(((k, repr(info[k])) for k in GROUP_KEYS if info.get(k) is not None), None)
    raw = info.get("prompt", info.get("question"))
    prompt = "" if raw is None else prompt_text(raw) if isinstance(raw, list) else str(raw)
    reference = None if ground_truth is None else str(ground_truth)
    return Sample(key, prompt, str(solution_str), reference)


def request(samples: Sequence[Sample]) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """Groups to send, and for each sample (group index, response index)."""
    groups: list[dict[str, Any]] = []
    by_key: dict[Any, int] = {}
    where: list[tuple[int, int]] = []
    for s in samples:
        g = by_key.get((s.key, s.reference)) if s.key is not None else None
        if g is None:
            g = len(groups)
            groups.append({"id": str(g), "prompt": s.prompt, "reference": s.reference,
                           "responses": []})  # fmt: skip
            if s.key is not None:
                by_key[(s.key, s.reference)] = g
        where.append((g, len(groups[g]["responses"])))
        groups[g]["responses"].append(s.response)
    return groups, where


def results(
    out: ScoreResponse, where: list[tuple[int, int]], masked_score: float
) -> list[dict[str, Any]]:
    rows = []
    errors: list[ScoreError] = []  # of the masked samples, in order
    for g, j in where:
        group = out.groups[g]
        total = group.rewards[j]
        row: dict[str, Any] = {"score": masked_score if total is None else total}
        for name, scores in {**group.components, **breakdown(group)}.items():
            row[name] = math.nan if scores[j] is None else scores[j]
        row["arbiter_masked"] = 1.0 if total is None else 0.0
        rows.append(row)
        if total is None:
            errors.extend(e for e in group.errors if e.index == j)
    masked = int(sum(r["arbiter_masked"] for r in rows))
    if masked:
        _warn_masked(masked, len(rows), masked_score, errors)
    return rows


# Why a kind happens with verl, where that is not obvious from the kind alone.
HINTS = {
    "group_too_small": "a group of one sample has no diversity: give every sample of a "
    "prompt the same extra_info key (uid, group, index, prompt or question) and let them "
    "arrive within window_ms (compute_score_async, or the batch manager)",
}


def _warn_masked(masked: int, n: int, masked_score: float, errors: list[ScoreError]) -> None:
    """Once per process and kind: how many, the kind, its first reason, the fill value."""
    reason = first_reason(errors, _warned_kinds)
    if reason is None:
        return
    kind, why = reason
    hint = f"; {HINTS[kind]}" if kind in HINTS else ""
    log.warning(
        "Arbiter could not score %d of %d samples, kind %r (%s%s). verl needs a number, so "
        "they get score=%s with arbiter_masked=1 (reward_kwargs.masked_score sets it)",
        masked, n, kind, why[:500], hint, masked_score,
    )  # fmt: skip


def _batch(kw: dict[str, Any]) -> list[Sample] | None:
    if kw.get("solution_strs") is None:
        return None
    sols = list(kw.pop("solution_strs"))
    truths = kw.pop("ground_truths", None)
    infos = kw.pop("extra_infos", None)
    kw.pop("data_sources", None)
    truths = [None] * len(sols) if truths is None else list(truths)
    infos = [None] * len(sols) if infos is None else list(infos)
    if not len(sols) == len(truths) == len(infos):
        raise ValueError(
            f"solution_strs ({len(sols)}), ground_truths ({len(truths)}) and extra_infos "
            f"({len(infos)}) must have the same length"
        )
    return [sample(s, t, i) for s, t, i in zip(sols, truths, infos, strict=True)]


# -- the window: concurrent single calls → one request -----------------------------------
@dataclass
class Window:
    settings: Settings
    pending: list[tuple[Sample, asyncio.Future[dict[str, Any]]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None

    def submit(self, s: Sample) -> asyncio.Future[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.pending.append((s, fut))
        if len(self.pending) >= MAX_BATCH:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.settings.window_ms / 1000, self._flush)
        return fut

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending, []
        if batch:
            asyncio.get_running_loop().create_task(self._send(batch))

    async def _send(self, batch: list[tuple[Sample, asyncio.Future[dict[str, Any]]]]) -> None:
        try:
            rows = await _ascore([s for s, _ in batch], self.settings)
        except Exception as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), row in zip(batch, rows, strict=True):
            if not fut.done():
                fut.set_result(row)


_WINDOWS: dict[tuple[int, Settings], Window] = {}


def _window(settings: Settings) -> Window:
    loop = asyncio.get_running_loop()
    for key in [k for k in _WINDOWS if k[0] != id(loop) and not _WINDOWS[k].pending]:
        del _WINDOWS[key]  # windows of loops no longer in use
    return _WINDOWS.setdefault((id(loop), settings), Window(settings))


async def _ascore(samples: Sequence[Sample], settings: Settings) -> list[dict[str, Any]]:
    groups, where = request(samples)
    out = await settings.client().ascore(groups, settings.recipe)
    return results(out, where, settings.masked_score)


# -- entry points ------------------------------------------------------------------------
async def compute_score_async(
    data_source: Any = None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Any = None,
    **kw: Any,
) -> dict[str, Any] | list[dict[str, Any]]:
    """verl's async reward function: one sample, or a batch (``solution_strs=`` …)."""
    batch = _batch(kw)
    settings = Settings.from_kwargs(kw)
    if batch is not None:
        return await _ascore(batch, settings) if batch else []
    if solution_str is None:
        raise TypeError("compute_score needs solution_str (one sample) or solution_strs (batch)")
    s = sample(solution_str, ground_truth, extra_info)
    if settings.window_ms <= 0:
        return (await _ascore([s], settings))[0]
    return await _window(settings).submit(s)


_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid, loop)


def _background_loop() -> asyncio.AbstractEventLoop:
    """One event loop in a daemon thread: sync calls from many threads meet in its window.
    A forked child (Ray, multiprocessing) does not inherit the thread, so it makes its own."""
    global _LOOP
    with _LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid() or _LOOP[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="arbiter-verl", daemon=True).start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


def compute_score(
    data_source: Any = None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Any = None,
    **kw: Any,
) -> dict[str, Any] | list[dict[str, Any]]:
    """verl's reward function (sync): one sample, or a batch (``solution_strs=`` …)."""
    coro = compute_score_async(data_source, solution_str, ground_truth, extra_info, **kw)
    return asyncio.run_coroutine_threadsafe(coro, _background_loop()).result()
