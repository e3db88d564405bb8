"""Capture real vLLM chat-completion bodies into ``fixtures/`` for the parsing tests.

    .venv/bin/python -m tests.services.judge.capture http://127.0.0.1:8010/v1 tiny

Each request is the one the judge sends (built by ``services.judge.scoring.Judge``), so
the fixtures are the shapes the judge really reads. The full-vocabulary log-probs list
is trimmed to its top 20 entries plus every Yes/No variant (each entry is untouched).
The test ``test_vllm.py::test_fixture_shapes_match_live_server`` re-captures into a
temporary folder and checks that the shapes still agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from arbiter.proto.components import ScoreGroup
from arbiter.proto.judge import QualityParams, VerifierParams, VerifierRequest
from arbiter.services.judge.scoring import Judge
from arbiter.services.judge.settings import JudgeSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GROUP = ScoreGroup(
    id="g",
    prompt="Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?",
    reference="72",
    responses=["<think>48 / 2 = 24; 48 + 24 = 72</think><answer>72</answer>"],
)
LABEL_TEXTS = {"yes", "no"}


def _verifier(judge: Judge, **params: Any) -> dict[str, Any]:
    req = VerifierRequest(groups=[GROUP], params=VerifierParams(**params))
    return judge.verifier_payload(GROUP, GROUP.responses[0], req)


def requests(judge: Judge, vocab: int) -> dict[str, dict[str, Any]]:
    """Fixture name → chat-completions request body (without the model)."""
    q = QualityParams()
    resp = GROUP.responses[0]
    token_ids = {**_verifier(judge, top_logprobs=5), "return_tokens_as_token_ids": True}
    too_long = judge.quality_payload(
        GROUP.model_copy(update={"prompt": "x " * 4000}), resp, q, True
    )
    return {
        "quality_json_schema": judge.quality_payload(GROUP, resp, q, True),
        "quality_text": judge.quality_payload(GROUP, resp, q, False),
        "verifier_top20": _verifier(judge, top_logprobs=20),
        "verifier_full_vocab": _verifier(judge, top_logprobs=vocab),
        "verifier_constrained": _verifier(judge, top_logprobs=5, constrain_labels=True),
        "verifier_token_ids": token_ids,
        "error_context_length": too_long,
    }


def _trim(body: dict[str, Any]) -> dict[str, Any]:
    if "choices" not in body:
        return body
    content = (body["choices"][0].get("logprobs") or {}).get("content") or []
    for pos in content:
        top = pos.get("top_logprobs") or []
        if len(top) > 20:
            keep = top[:20] + [e for e in top[20:] if e["token"].strip().casefold() in LABEL_TEXTS]
            pos["top_logprobs"] = keep
            body["_trimmed"] = f"top_logprobs: top 20 of {len(top)} + every Yes/No variant"
    return body


def capture(base_url: str, model: str, out_dir: Path = FIXTURES) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    judge = Judge(JudgeSettings(base_url=base_url, model=model))
    with httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=60) as http:
        models = http.get("models").json()
        vocab = _vocab(http, model)
        written = []
        for name, payload in requests(judge, vocab).items():
            r = http.post("chat/completions", json={"model": model, **payload})
            record = {"request": payload, "status": r.status_code, "response": _trim(r.json())}
            path = out_dir / f"{name}.json"
            path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            written.append(path)
        (out_dir / "models.json").write_text(json.dumps(models, indent=1, sort_keys=True) + "\n")
        written.append(out_dir / "models.json")
    return written


def _vocab(http: httpx.Client, model: str) -> int:
    """The largest top_logprobs the server accepts: its error message names the maximum."""
    r = http.post(
        "chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
              "logprobs": True, "top_logprobs": 10_000_000},
    )  # fmt: skip
    msg = r.json()["error"]["message"]
    return int(msg.split("max allowed:")[1].split()[0].strip(" ()"))


if __name__ == "__main__":
    for p in capture(sys.argv[1], sys.argv[2]):
        print(p)
