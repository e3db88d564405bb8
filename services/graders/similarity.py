"""``string_check`` and ``text_similarity``'s metrics (all but ``cosine``, which needs the
embedding service): pure functions of two strings, each a score from 0 to 1, from the
libraries OpenAI's graders use or the field's standard ones.

- ``fuzzy_match``: ``rapidfuzz.fuzz.ratio`` / 100 (the normalised Indel similarity).
- ``bleu``: ``nltk``'s sentence BLEU (4-grams, equal weights) with Chen and Cherry's
  smoothing method 1, so a short answer missing a 4-gram is not 0 outright; ``gleu``:
  ``nltk``'s sentence GLEU. Both tokenise with ``nltk``'s ``wordpunct_tokenize`` (a regular
  expression; punkt's data is not shipped).
- ``rouge_1`` … ``rouge_5``, ``rouge_l``: ``rouge-score``'s F-measure (its own tokeniser:
  lower case, ASCII letters and digits). ``rouge_l``'s longest common subsequence is
  computed by ``rapidfuzz.distance.LCSseq`` over rouge-score's tokens: the same number,
  bit-parallel in C (10,000 words a side: 23 ms) where rouge-score's pure-Python table is
  quadratic (44 s, on the gateway's event loop or its threads).

Each side is at most ``MAX_CHARS`` characters (``too_long``): the metrics' cost grows with
length (``fuzzy_match`` with the product of the two), and they run in the gateway, which
every team shares.
"""

from __future__ import annotations

from functools import cache
from typing import Any

# The libraries load on first use: nltk and rouge-score take seconds to import, which every
# gateway start would pay whether or not a recipe uses text_similarity.
ROUGE = {f"rouge_{n}": f"rouge{n}" for n in (1, 2, 3, 4, 5)} | {"rouge_l": "rougeL"}


def loaded(metric: str) -> bool:
    """Whether ``metric``'s library is imported already (else the first call imports it)."""
    import sys

    module = {"fuzzy_match": "rapidfuzz", "bleu": "nltk", "gleu": "nltk"}.get(metric, "rouge_score")
    return module in sys.modules


def string_check(operation: str, text: str, reference: str) -> float:
    if operation == "eq":
        return float(text == reference)
    if operation == "ne":
        return float(text != reference)
    if operation == "like":
        return float(reference in text)
    if operation == "ilike":
        return float(reference.casefold() in text.casefold())
    raise ValueError(f"unknown operation {operation!r}")


MAX_CHARS = 65_536  # per side: fuzzy_match ~0.13 s, bleu ~0.12 s at this length (2 cores)


def too_long(text: str, reference: str) -> str | None:
    """Why the pair is not compared (a side over ``MAX_CHARS``), or None."""
    for name, value in (("input", text), ("reference", reference)):
        if len(value) > MAX_CHARS:
            return (
                f"the {name} is {len(value):,} characters; text_similarity compares at most "
                f"{MAX_CHARS:,} a side"
            )
    return None


@cache
def _rouge(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind])


def _rouge_l(text: str, reference: str) -> float:
    """rouge-score's ROUGE-L F-measure, its LCS by rapidfuzz (see the module docstring)."""
    from rapidfuzz.distance import LCSseq
    from rouge_score import scoring

    tokenize = _rouge("rougeL")._tokenizer.tokenize
    target, prediction = tokenize(reference), tokenize(text)
    if not target or not prediction:
        return 0.0
    lcs = LCSseq.similarity(target, prediction)
    return float(scoring.fmeasure(lcs / len(prediction), lcs / len(target)))


def similarity(metric: str, text: str, reference: str) -> float:
    """``text`` against ``reference`` by ``metric`` (not ``cosine``), in [0, 1]."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return float(fuzz.ratio(text, reference)) / 100.0
    if metric in ("bleu", "gleu"):
        from nltk.tokenize import wordpunct_tokenize
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
        from nltk.translate.gleu_score import sentence_gleu

        hyp, ref = wordpunct_tokenize(text), wordpunct_tokenize(reference)
        if not hyp or not ref:
            return float(hyp == ref)
        if metric == "bleu":
            return float(sentence_bleu([ref], hyp, smoothing_function=SmoothingFunction().method1))
        return float(sentence_gleu([ref], hyp))
    if metric == "rouge_l":
        return _rouge_l(text, reference)
    if metric in ROUGE:
        kind = ROUGE[metric]
        return float(_rouge(kind).score(reference, text)[kind].fmeasure)
    raise ValueError(f"{metric!r} is not a local metric")
