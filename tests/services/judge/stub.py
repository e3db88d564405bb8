"""A stand-in OpenAI-compatible server for faults the real vLLM cannot be made to show.

vLLM always honours ``logprobs`` and ``response_format``, never answers slowly on
purpose and never sends 503s on demand; these tests need a server that does. The model
name picks the behaviour (the judge's ``JUDGE_MODEL`` setting), so one stub process
serves every fault test:

- ``slow``: sleeps ``STUB_SLOW_S`` (default 30 s) before answering — a hung judge.
- ``no_logprobs``: answers normally but leaves ``logprobs`` out, as `transformers serve`
  does (NOTES.md) — the verifier must say judge_unsupported, readiness must say why.
- ``flaky``: 503 for the first two attempts of each distinct request, then answers.
- ``refuse_json``: 400 on ``response_format`` (a server without structured outputs),
  otherwise answers "Overall: 4".
- ``count``: answers after 0.2 s and records the most requests it held at once.

Started with ``uvicorn tests.services.judge.stub:create_app --factory``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def _completion(model: str, content: str, logprobs: Any = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": logprobs,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }


def _yes_no_logprobs() -> dict[str, Any]:
    top = [
        {"token": "Yes", "logprob": -0.5, "bytes": [89, 101, 115]},
        {"token": "No", "logprob": -1.5, "bytes": [78, 111]},
    ]
    return {"content": [{"token": "Yes", "logprob": -0.5, "top_logprobs": top}]}


def create_app() -> FastAPI:
    app = FastAPI()
    attempts: Counter[str] = Counter()
    state = {"in_flight": 0, "max_in_flight": 0}
    slow_s = float(os.environ.get("STUB_SLOW_S", "30"))
    models = ["slow", "no_logprobs", "flaky", "refuse_json", "count"]

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}

    @app.get("/stats")
    async def stats() -> dict[str, int]:
        return dict(state)

    @app.post("/stats/reset")
    async def reset_stats() -> dict[str, int]:
        # Another test's cancelled requests may still be sleeping here (0.2 s each): let them
        # finish first.
        await asyncio.sleep(0.25)
        state["max_in_flight"] = state["in_flight"]
        return dict(state)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        model = body.get("model", "")
        wants_logprobs = bool(body.get("logprobs"))
        text = "Yes" if wants_logprobs else '{"overall": 4}'
        if model == "slow":
            await asyncio.sleep(slow_s)
        elif model == "no_logprobs":
            return JSONResponse(_completion(model, text))
        elif model == "flaky":
            key = json.dumps(body["messages"], sort_keys=True)
            attempts[key] += 1
            if attempts[key] <= 2:
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        elif model == "refuse_json":
            if "response_format" in body:
                err = {"message": "response_format is not supported", "param": "response_format"}
                return JSONResponse({"error": err}, status_code=400)
            return JSONResponse(_completion(model, "Overall: 4"))
        elif model == "count":
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                await asyncio.sleep(0.2)
            finally:
                state["in_flight"] -= 1
        return JSONResponse(
            _completion(model, text, _yes_no_logprobs() if wants_logprobs else None)
        )

    return app
