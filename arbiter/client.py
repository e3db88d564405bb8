"""Python client for the gateway, and a drop-in reward function for TRL's GRPOTrainer.

    from arbiter.client import ArbiterClient, trl_reward

    client = ArbiterClient("http://127.0.0.1:8000")
    out = client.score([{"prompt": q, "reference": "18", "responses": [r1, r2]}], "gsm8k")

    trainer = GRPOTrainer(..., reward_funcs=[trl_reward("gsm8k", reference_column="answer")])

The TRL adapter regroups TRL's flat batch (each prompt repeated ``num_generations``
times in a row) into Arbiter groups, so group-level components (diversity) see whole
groups, and returns ``None`` for masked rewards, which TRL treats as "no signal"
(NaN-aware means) instead of a fake 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx

from arbiter.proto.common import ErrorResponse
from arbiter.proto.gateway import Recipe, ScoreGroup, ScoreRequest, ScoreResponse

RecipeArg = str | Recipe | dict[str, Any]
GroupArg = ScoreGroup | dict[str, Any]


class ArbiterError(RuntimeError):
    """A non-2xx answer from the gateway, with the envelope's fields."""

    def __init__(self, status: int, body: ErrorResponse | None, text: str):
        self.status = status
        self.error = body.error if body else None
        detail = f"{body.error.type}: {body.error.message}" if body else text[:300]
        super().__init__(f"HTTP {status} {detail}")

    @property
    def retryable(self) -> bool:
        return self.status in (429, 503, 504)


def _request(groups: Sequence[GroupArg], recipe: RecipeArg, on_error: str) -> dict[str, Any]:
    req = ScoreRequest.model_validate(
        {
            "recipe": recipe.model_dump() if isinstance(recipe, Recipe) else recipe,
            "groups": [g.model_dump() if isinstance(g, ScoreGroup) else g for g in groups],
            "on_error": on_error,
        }
    )
    return req.model_dump(mode="json")


def _parse(r: httpx.Response) -> ScoreResponse:
    if r.status_code != 200:
        try:
            body: ErrorResponse | None = ErrorResponse.model_validate_json(r.content)
        except ValueError:
            body = None
        raise ArbiterError(r.status_code, body, r.text)
    return ScoreResponse.model_validate_json(r.content)


class ArbiterClient:
    """Sync and async scoring through one kept-alive connection pool each."""

    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", timeout: float = 300.0, **httpx_kwargs: Any
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = httpx.Timeout(timeout, connect=10.0)
        self._kwargs = httpx_kwargs
        self._sync: httpx.Client | None = None
        self._async: httpx.AsyncClient | None = None

    def score(
        self,
        groups: Sequence[GroupArg],
        recipe: RecipeArg = "gsm8k",
        on_error: Literal["mask", "fail"] = "mask",
    ) -> ScoreResponse:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self._timeout, **self._kwargs)
        body = _request(groups, recipe, on_error)
        return _parse(self._sync.post(f"{self.base_url}/v1/score", json=body))

    async def ascore(
        self,
        groups: Sequence[GroupArg],
        recipe: RecipeArg = "gsm8k",
        on_error: Literal["mask", "fail"] = "mask",
    ) -> ScoreResponse:
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self._timeout, **self._kwargs)
        body = _request(groups, recipe, on_error)
        return _parse(await self._async.post(f"{self.base_url}/v1/score", json=body))

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()


def _text(item: Any) -> str:
    """TRL passes plain strings, or conversations (lists of {role, content} messages)."""
    if isinstance(item, str):
        return item
    if isinstance(item, list) and item and isinstance(item[-1], dict):
        return str(item[-1].get("content", ""))
    raise TypeError(f"expected a string or a list of messages, got {type(item).__name__}")


def trl_reward(
    recipe: RecipeArg = "gsm8k",
    base_url: str = "http://127.0.0.1:8000",
    reference_column: str | None = "answer",
    client: ArbiterClient | None = None,
) -> Callable[..., list[float | None]]:
    """A TRL reward function scoring each rollout group through Arbiter's gateway."""
    arbiter = client or ArbiterClient(base_url)

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        refs = kwargs.get(reference_column) if reference_column else None
        groups: list[dict[str, Any]] = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            p = _text(prompt)
            ref = None if refs is None else str(refs[i])
            if groups and groups[-1]["prompt"] == p and groups[-1]["reference"] == ref:
                groups[-1]["responses"].append(_text(completion))
            else:
                groups.append({"id": str(len(groups)), "prompt": p, "reference": ref,
                               "responses": [_text(completion)]})  # fmt: skip
        out = arbiter.score(groups, recipe)
        return [r for g in out.groups for r in g.rewards]

    name = recipe if isinstance(recipe, str) else "inline"
    reward.__name__ = f"arbiter_{name}".replace("-", "_")
    return reward
