"""Trainer fixtures: the tiny random Qwen2 (built once per session) and small configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arbiter.tiny_model import build


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, gsm8k_dir: Path) -> Path:
    return build(tmp_path_factory.mktemp("tiny-model") / "model", gsm8k_dir)


@pytest.fixture(scope="session")
def seven_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy task in GSM8K format: every problem's answer is 7."""
    d = tmp_path_factory.mktemp("seven")
    for name, n in (("train.jsonl", 64), ("test.jsonl", 8)):
        rows = [
            {"question": f"Say the number seven. ({name[:2]}{i})", "answer": "#### 7"}
            for i in range(n)
        ]
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture(scope="session")
def tiny_model_small_vocab(tmp_path_factory: pytest.TempPathFactory, gsm8k_dir: Path) -> Path:
    """The tiny model with a ~400-token vocabulary: a random policy hits a given digit ~5x
    as often as with the default 2,052 tokens, so the toy task starts learning sooner."""
    return build(tmp_path_factory.mktemp("tiny-model-400") / "model", gsm8k_dir, vocab_size=400)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The tiny model loaded for the sampler tests (fp32, eval), and its left-padding
    tokenizer; random init at std 0.02 repeats one token forever, larger weights give varied
    greedy text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build(tmp_path_factory.mktemp("tiny") / "m", None)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.eval(), tok
