"""Read scores out of chat-completion bodies (pure functions, no I/O).

Quality: the judge's text → a rating on 1..scale → (overall − 1) / (scale − 1). Tried in
order: the first JSON object holding ``overall`` (or ``score``); ``overall: N``;
``Score: N``. Anything else is a parse error — never a 0.

Verifier: the first generated token's ``top_logprobs`` → p(Yes) / (p(Yes) + p(No)),
where each side sums every entry whose text, stripped of whitespace and case-folded, is
``yes`` / ``no`` (``Yes``, `` yes``, ``YES``…). Each list entry is a distinct token, so
two tokens that display alike both count. A token whose text the server shows empty (a
byte fragment) is read from its ``bytes``; such fragments never spell a whole label.
Entries at vLLM's grammar-mask floor (−9999) carry no probability and are skipped.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from arbiter.errors import ItemFailure
from arbiter.proto.judge import QUALITY_DIMENSIONS

MASKED_LOGPROB = -9000.0  # vLLM reports grammar-blocked tokens at -9999.0
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_NUM = r"(-?\d+(?:\.\d+)?)"
_OVERALL = re.compile(r"\boverall\b[^0-9\n-]{0,24}?" + _NUM, re.IGNORECASE)
_SCORE = re.compile(r"\b(?:score|rating)\b[^0-9\n-]{0,24}?" + _NUM, re.IGNORECASE)
_DIM = {
    d: re.compile(rf"\b{d}\b[^0-9\n-]{{0,24}}?{_NUM}", re.IGNORECASE) for d in QUALITY_DIMENSIONS
}


class JudgeReplyError(ItemFailure):
    """The judge's reply cannot be scored; ``kind`` is the item's wire ErrorKind."""


@dataclass(frozen=True)
class QualityVerdict:
    overall: float
    score: float  # (overall - 1) / (scale - 1), in [0, 1]
    dimensions: dict[str, float] = field(default_factory=dict)
    source: str = "json"  # json | overall_text | score_text


@dataclass(frozen=True)
class LabelVerdict:
    p_yes: float  # p(Yes) / (p(Yes) + p(No))
    logprob_yes: float | None  # log of the summed Yes variants; None when none was listed
    logprob_no: float | None


def message_text(body: dict[str, Any]) -> str:
    """The first choice's message content (empty string when missing)."""
    try:
        content = body["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise JudgeReplyError("bad_response", f"not a chat completion: {exc!r}") from exc
    return content if isinstance(content, str) else ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*" + _NUM + r"(?:\s*/\s*\d+)?\s*", value)
        return float(m.group(1)) if m else None
    return None


def _first_json_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _check_range(value: float, scale: int, what: str) -> float:
    if not 1 <= value <= scale:
        raise JudgeReplyError("judge_parse_error", f"{what} {value:g} is outside 1..{scale}")
    return value


def finish_reason(body: dict[str, Any]) -> str | None:
    """The first choice's ``finish_reason`` ("length": cut at max_tokens), if any."""
    try:
        reason = body["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


def parse_quality(text: str, scale: int, cut: bool = False) -> QualityVerdict:
    """The judge's reply text → a verdict; raises ``JudgeReplyError(judge_parse_error)``.

    ``cut``: the reply stopped at max_tokens. A rating read from its text that ends where the
    reply ends may be a number cut short ("overall: 1" of "overall: 10"): no verdict, rather
    than a low score kept in the cache. A complete JSON object is a verdict, cut or not."""
    visible = _THINK.sub("", text)
    if re.search(r"<think>", visible, re.IGNORECASE):
        raise JudgeReplyError("judge_parse_error", "reply ended inside <think> (raise max_tokens)")
    obj = _first_json_object(visible)
    if obj is not None:
        keys = {str(k).strip().lower(): v for k, v in obj.items()}
        dims = {d: n for d in QUALITY_DIMENSIONS if (n := _number(keys.get(d))) is not None}
        overall = dims.get("overall")
        if overall is None:
            overall = _number(keys.get("score", keys.get("rating")))
        if overall is not None:
            for d, v in dims.items():
                _check_range(v, scale, d)
            dims["overall"] = _check_range(overall, scale, "overall")
            return QualityVerdict(overall, (overall - 1) / (scale - 1), dims, "json")
    for pattern, source in ((_OVERALL, "overall_text"), (_SCORE, "score_text")):
        m = pattern.search(visible)
        if m:
            if cut and not visible[m.end(1) :].strip():
                raise JudgeReplyError(
                    "judge_parse_error",
                    "the reply was cut at max_tokens right after its rating (raise max_tokens)",
                )
            overall = _check_range(float(m.group(1)), scale, "overall")
            dims = {}
            for d, rx in _DIM.items():
                dm = rx.search(visible)
                if dm and 1 <= float(dm.group(1)) <= scale:
                    dims[d] = float(dm.group(1))
            dims["overall"] = overall
            return QualityVerdict(overall, (overall - 1) / (scale - 1), dims, source)
    snippet = visible.strip()[:120]
    raise JudgeReplyError("judge_parse_error", f"no score in the judge's reply: {snippet!r}")


def _token_text(entry: dict[str, Any]) -> str:
    token = entry.get("token")
    if isinstance(token, str) and token and not token.startswith("token_id:"):
        return token
    raw = entry.get("bytes")
    if isinstance(raw, list) and raw and not (isinstance(token, str) and token):
        try:
            return bytes(raw).decode("utf-8", errors="strict")
        except (ValueError, TypeError):
            return ""
    return token if isinstance(token, str) else ""


def _logsumexp(values: list[float]) -> float | None:
    if not values:
        return None
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def first_token_top_logprobs(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``choices[0].logprobs.content[0].top_logprobs`` as a list of {token, logprob, bytes}.

    Raises ``judge_unsupported`` when the server left log-probs out (it ignored the
    request's ``logprobs``), ``bad_response`` when the shape is something else.
    """
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise JudgeReplyError("bad_response", f"not a chat completion: {exc!r}") from exc
    logprobs = choice.get("logprobs")
    if not logprobs:
        raise JudgeReplyError(
            "judge_unsupported", "the judge server returned no logprobs (it ignores 'logprobs')"
        )
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content:
        raise JudgeReplyError("bad_response", "logprobs.content is empty: no token generated")
    top = content[0].get("top_logprobs")
    if isinstance(top, dict):  # legacy {token: logprob} maps
        top = [{"token": k, "logprob": v} for k, v in top.items()]
    if not top:
        raise JudgeReplyError(
            "judge_unsupported", "the judge server returned no top_logprobs (it ignores them)"
        )
    return [e for e in top if isinstance(e, dict)]


def label_probability(top: list[dict[str, Any]]) -> LabelVerdict:
    """p(Yes) / (p(Yes) + p(No)) from one position's top log-probs."""
    yes: list[float] = []
    no: list[float] = []
    for entry in top:
        lp = entry.get("logprob")
        if not isinstance(lp, int | float) or not math.isfinite(lp) or lp <= MASKED_LOGPROB:
            continue
        label = _token_text(entry).strip().casefold()
        if label == "yes":
            yes.append(float(lp))
        elif label == "no":
            no.append(float(lp))
    lp_yes, lp_no = _logsumexp(yes), _logsumexp(no)
    if lp_yes is None and lp_no is None:
        raise JudgeReplyError(
            "judge_no_label", f"neither Yes nor No among the top {len(top)} log-probs"
        )
    if lp_yes is None:
        p = 0.0
    elif lp_no is None:
        p = 1.0
    else:
        both = _logsumexp([lp_yes, lp_no])
        assert both is not None
        p = min(1.0, max(0.0, math.exp(lp_yes - both)))
    return LabelVerdict(p, lp_yes, lp_no)


def usage_tokens(body: dict[str, Any]) -> tuple[int, int]:
    usage = body.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
