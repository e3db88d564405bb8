"""Build a tiny random-initialised Qwen2 model and an offline-trained tokenizer.

Model hubs are unreachable here, so the judge's vLLM test server and the trainer's CPU
tests use a model this module builds: a byte-level BPE tokenizer trained with
``tokenizers`` on GSM8K-style text (Qwen2's pre-tokenizer regex, ChatML chat template),
and a random-init ``Qwen2ForCausalLM`` with head_dim 64 (vLLM's CPU attention rejects
smaller heads). Words the judge and the trainer need are single tokens: ``Yes``, ``No``
(with and without a leading space), every digit, and the tags ``<think>``, ``</think>``,
``<answer>``, ``</answer>``.

    python -m arbiter.tiny_model OUT_DIR [--hidden 64 --layers 2 --heads 1 --data DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from arbiter import gsm8k

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
MUST_BE_SINGLE = ["Yes", "No", " Yes", " No", *[str(d) for d in range(10)], "{", "}", '"', ":"]

_JUDGE_LINES = [
    "Is the answer correct? Yes",
    "Is the answer correct? No",
    'Reply with JSON: {"correctness": 4, "reasoning": 3, "clarity": 5, "overall": 4}',
    "Score: 3. Yes, the reasoning is clear. No, the answer is wrong.",
    "Answer Yes or No. Yes. No. Yes. No.",
    "Yes",
    "No",
    "Yes, it is.",
    "No, it is not.",
]


def _corpus(data_dir: Path | None, limit: int = 4000, seed: int = 0) -> Iterator[str]:
    rng = random.Random(seed)
    train = data_dir / "train.jsonl" if data_dir else None
    if train is not None and train.exists():
        with train.open() as f:
            for i, line in enumerate(f):
                if i >= limit:
                    break
                row = json.loads(line)
                yield row["question"]
                yield f"<think>{row['answer'].split('####')[0]}</think><answer>"
                yield f"{row['answer'].split('####')[-1].strip()}</answer>"
    for _ in range(2000):  # arithmetic, so numbers and operators are well covered
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        yield f"What is {a} + {b}? <think>{a} + {b} = {a + b}</think><answer>{a + b}</answer>"
    for _ in range(400):
        yield from _JUDGE_LINES


def build_tokenizer(out_dir: Path, texts: Iterable[str], vocab_size: int = 2048) -> None:
    """Train a byte-level BPE tokenizer and save it as a transformers fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens(TAG_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    for word in MUST_BE_SINGLE + TAG_TOKENS:
        ids = fast.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"{word!r} is {len(ids)} tokens; add it to the corpus more often")
    fast.save_pretrained(out_dir)


def build_model(
    out_dir: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 1,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 1024,
    seed: int = 0,
) -> None:
    """Random-init Qwen2 with head_dim 64, sized to the tokenizer already in ``out_dir``."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden // heads != 64:
        raise ValueError(f"head_dim must be 64 for vLLM's CPU attention, got {hidden // heads}")
    tok = AutoTokenizer.from_pretrained(out_dir)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out_dir)


def build(
    out_dir: Path,
    data_dir: Path | None = None,
    *,
    vocab_size: int = 2048,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 1,
    seed: int = 0,
) -> Path:
    """Tokenizer + model into ``out_dir`` (idempotent: skips when already built)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "tokenizer.json").exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir, _corpus(data_dir, seed=seed), vocab_size=vocab_size)
    build_model(out_dir, hidden=hidden, layers=layers, heads=heads, seed=seed)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument(
        "--data", type=Path, default=None,
        help=f"GSM8K dir for the tokenizer's corpus (default: ${gsm8k.ENV}, else {gsm8k.BESIDE})",
    )  # fmt: skip
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        data = gsm8k.require(a.data, "--data DIR")
    except FileNotFoundError as exc:
        p.error(str(exc))
    out = build(
        a.out_dir,
        data,
        vocab_size=a.vocab_size,
        hidden=a.hidden,
        layers=a.layers,
        heads=a.heads,
        seed=a.seed,
    )
    print(out)


if __name__ == "__main__":
    main()
