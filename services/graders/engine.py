"""Grade a batch of rows with one grader: each row a sample (the response) and an item (its
group's row). Work is batched per grader: one embedding call for every ``cosine`` row, one
sandbox call per ``python`` grader, one judge call per model grader; a ``multi`` grades
its sub-graders concurrently, then evaluates ``calculate_output`` per row.

A row's ``Outcome`` is its score or ``None`` with the reason (``kind``, an ``ErrorKind``)
and OpenAI's error flag. A failure that is not the response's (a service down) is null,
never 0. A response that is not the JSON a template reads (``sample_parse_error``) is the
response's failure: 0, with the flag. An ``item`` variable a row lacks raises
``MissingVariable`` (the caller's data: 422).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from arbiter.proto.graders import (
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from arbiter.services.graders import expression, similarity
from arbiter.services.graders.templating import SampleParseError, render

AnyGrader = (
    StringCheckGrader
    | TextSimilarityGrader
    | PythonGrader
    | ScoreModelGrader
    | LabelModelGrader
    | MultiGrader
)
ModelGrader = ScoreModelGrader | LabelModelGrader
# From this many rows, or characters in all, the pure metrics run on a worker thread: a
# batch under both costs the event loop well under 10 ms.
THREAD_ROWS = 64
THREAD_CHARS = 16_384


@dataclass(frozen=True)
class Row:
    """One response to grade: OpenAI's ``sample`` and ``item``, and where it came from
    (``group``: the index of its group in the batch, whose fields a python grader gets)."""

    sample: dict[str, Any]
    item: dict[str, Any]
    group: int


@dataclass
class Outcome:
    score: float | None
    kind: str | None = None  # why null (an ErrorKind)
    message: str = ""
    flags: dict[str, Any] = field(default_factory=dict)  # OpenAI's metadata.errors, set ones
    sub: dict[str, float | None] = field(default_factory=dict)  # multi: each sub-grader's
    tokens: int = 0  # judge tokens

    @classmethod
    def failed(cls, kind: str, message: str, **flags: Any) -> Outcome:
        return cls(None, kind, message, dict(flags))


class Backend(Protocol):
    """The services a grader reaches. Each answers one outcome per row, in order; a service
    failure is outcomes with the reason, never an exception."""

    async def embed_cosine(self, pairs: list[tuple[str, str]]) -> list[Outcome]: ...

    async def python(self, grader: PythonGrader, rows: list[Row]) -> list[Outcome]: ...

    async def model(
        self, grader: ModelGrader, messages: list[list[dict[str, str]]]
    ) -> list[Outcome]: ...


def _pairs(
    grader: StringCheckGrader | TextSimilarityGrader, rows: list[Row]
) -> list[tuple[str, str] | Outcome]:
    out: list[tuple[str, str] | Outcome] = []
    for row in rows:
        try:
            pair = (
                render(grader.input, row.sample, row.item),
                render(grader.reference, row.sample, row.item),
            )
        except SampleParseError as exc:  # the response is not the JSON the grader reads
            out.append(Outcome(0.0, None, str(exc), {"sample_parse_error": True}))
            continue
        out.append(pair)
    return out


def _local(grader: StringCheckGrader | TextSimilarityGrader, rows: list[Row]) -> list[Outcome]:
    out = []
    for pair in _pairs(grader, rows):
        if isinstance(pair, Outcome):
            out.append(pair)
        elif isinstance(grader, StringCheckGrader):
            out.append(Outcome(similarity.string_check(grader.operation, *pair)))
        elif (why := similarity.too_long(*pair)) is not None:
            out.append(Outcome.failed("grader_error", why))
        else:
            out.append(Outcome(similarity.similarity(grader.evaluation_metric, *pair)))
    return out


def _chars(rows: list[Row]) -> int:
    """The responses' and the items' text, what a template can put in a pair."""
    return sum(
        len(row.sample.get("output_text") or "")
        + sum(len(v) for v in row.item.values() if isinstance(v, str))
        for row in rows
    )


def content_text(content: Any) -> str:
    """A message's content as text: a string, a text part, or a list of them joined."""
    parts = content if isinstance(content, list) else [content]
    return "".join(p if isinstance(p, str) else p.text for p in parts)


def messages(grader: ModelGrader, row: Row) -> list[dict[str, str]]:
    return [
        {"role": m.role, "content": render(content_text(m.content), row.sample, row.item)}
        for m in grader.input
    ]


async def grade(grader: AnyGrader, rows: list[Row], backend: Backend) -> list[Outcome]:
    """One outcome per row, in order."""
    if not rows:
        return []
    if isinstance(grader, MultiGrader):
        return await _multi(grader, rows, backend)
    if isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        if isinstance(grader, TextSimilarityGrader) and grader.evaluation_metric == "cosine":
            pairs = _pairs(grader, rows)
            todo = [p for p in pairs if not isinstance(p, Outcome)]
            done = iter(await backend.embed_cosine(todo) if todo else [])
            return [p if isinstance(p, Outcome) else next(done) for p in pairs]
        # a big batch, long texts, or a metric whose library loads on this call (seconds)
        # leave the event loop for a worker thread
        cold = isinstance(grader, TextSimilarityGrader) and not similarity.loaded(
            grader.evaluation_metric
        )
        if cold or len(rows) >= THREAD_ROWS or _chars(rows) >= THREAD_CHARS:
            return await asyncio.to_thread(_local, grader, rows)
        return _local(grader, rows)
    if isinstance(grader, PythonGrader):
        return await backend.python(grader, rows)
    return await backend.model(grader, [messages(grader, row) for row in rows])


async def _multi(grader: MultiGrader, rows: list[Row], backend: Backend) -> list[Outcome]:
    named = grader.named()
    node = expression.parse(grader.calculate_output, frozenset(named))
    results = await asyncio.gather(*(grade(g, rows, backend) for g in named.values()))
    by_name = dict(zip(named, results, strict=True))
    out = []
    for r in range(len(rows)):
        subs = {name: by_name[name][r] for name in named}
        sub_scores = {name: o.score for name, o in subs.items()}
        flags: dict[str, Any] = {}
        for o in subs.values():
            flags.update(o.flags)
        tokens = sum(o.tokens for o in subs.values())
        failed = [(name, o) for name, o in subs.items() if o.score is None]
        if failed:
            name, o = failed[0]
            outcome = Outcome(None, o.kind, f"{name}: {o.message}", flags, sub_scores, tokens)
        else:
            values = {name: s for name, s in sub_scores.items() if s is not None}
            try:
                score: float | None = expression.evaluate(node, values)
                outcome = Outcome(score, None, "", flags, sub_scores, tokens)
            except expression.FormulaError as exc:
                flags["formula_parse_error"] = True
                message = f"calculate_output: {exc}"
                outcome = Outcome(None, "grader_error", message, flags, sub_scores, tokens)
        out.append(outcome)
    return out


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None
