"""Math-Verify's own test cases through ``math_accuracy``, the answer in ``<answer>`` and raw.

The 270 gold/prediction cases of the library's ``tests/`` (``data/math_verify_cases.jsonl``)
must get the library's expected verdict, except the differences chosen on purpose
(``data/math_verify_differences.json``, each listed with its reason in
``docs/services/verify.md``), which must get the other verdict: a difference that goes away
is taken off the list, not left to hide a regression.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arbiter.services.verify.scoring import score_math_direct

DATA = Path(__file__).with_name("data")
CASES: list[dict[str, Any]] = [
    json.loads(line) for line in (DATA / "math_verify_cases.jsonl").read_text().splitlines()
]
DIFFERENCES: dict[str, str] = json.loads((DATA / "math_verify_differences.json").read_text())
DOCS = Path(__file__).parents[3] / "docs" / "services" / "verify.md"
# math-verify's own timeout per step: generous, this checks verdicts, not the host's speed
# (a sum of products, yujianll[4], takes ~10 s on a loaded 2-core machine).
TIMEOUT_S = 60


def test_the_corpus_is_the_whole_suite() -> None:
    # Every parametrized comparison of the library's tests at the recorded commit.
    assert len(CASES) == 270
    assert len({c["source"] for c in CASES}) == 270
    assert set(DIFFERENCES) <= {c["source"] for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["source"].split("/")[-1] for c in CASES])
def test_agrees_with_math_verify(case: dict[str, Any]) -> None:
    expected = float(case["expected"])
    if case["source"] in DIFFERENCES:
        expected = 1.0 - expected
    for response in (f"<answer>{case['pred']}</answer>", case["pred"]):
        r = score_math_direct(response, case["gold"], timeout_s=TIMEOUT_S)
        assert (r.score, r.kind) == (expected, None), (
            f"{case['source']}: {response[-120:]!r} against {case['gold'][-120:]!r}: "
            f"{r.score} {r.kind} {r.message}"
        )


def test_every_deliberate_difference_is_documented() -> None:
    docs = DOCS.read_text()
    missing = [source for source in DIFFERENCES if source not in docs]
    assert not missing, f"not listed in {DOCS.name}: {missing}"
