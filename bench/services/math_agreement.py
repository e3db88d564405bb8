"""Agreement of ``math_accuracy`` with test material nobody here wrote.

1. Math-Verify's own test cases (``tests/services/verify/data/math_verify_cases.jsonl``,
   270 gold/prediction pairs from the library's ``tests/``): how many get the suite's
   expected verdict, with the prediction as the whole ``<answer>`` block and as a raw
   response; beside them the library alone (``verify(parse(gold), parse(pred))``), with each
   case's own configuration and with the one configuration ``math_accuracy`` uses; and the
   deliberate differences (``math_verify_differences.json``).
2. GSM8K: OpenAI's 5,276 labelled model solutions (``gsm8k_model_solutions.jsonl.gz``:
   1.0 exactly when labelled correct), and the GSM8K test set's rationales with the final
   answer written in 15 styles, each once right (1.0 expected) and once wrong (0.0).

    .venv/bin/python -m bench.services.math_agreement [--groups 1319] [--json out.json]

Single process, in-process rule (``score_math_direct``); its timings are for scale only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from arbiter import gsm8k
from arbiter.services.verify.scoring import score_math_direct
from bench import record

DATA = Path(__file__).parents[2] / "tests" / "services" / "verify" / "data"
_CALC = re.compile(r"<<[^>]*>>")
# math-verify's own timeout per step for the suite's cases: verdicts, not the host's speed.
TIMEOUT_S = 60


def load_cases() -> tuple[list[dict[str, Any]], dict[str, str]]:
    cases = [json.loads(line) for line in (DATA / "math_verify_cases.jsonl").open()]
    differences = json.loads((DATA / "math_verify_differences.json").read_text())
    return cases, differences


def library_verdict(gold: str, pred: str, config: dict[str, Any] | None) -> int:
    """The library alone, with a case's configuration (None: math_accuracy's)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = config or {
        "match_types": ["latex", "expr"],
        "boxed_match_priority": 0,
        "allow_set_relation_comp": True,  # as the service (worker.py's _VERIFY)
    }
    extraction: list[Any] = [
        LatexExtractionConfig(boxed_match_priority=config["boxed_match_priority"])
        if m == "latex"
        else ExprExtractionConfig()
        for m in config["match_types"]
    ]
    return int(
        verify(
            parse(gold, extraction),
            parse(pred, extraction),
            float_rounding=config.get("precision", 6),
            strict=config.get("strict", True),
            allow_set_relation_comp=config.get("allow_set_relation_comp", False),
        )
    )


def math_verify_suite() -> dict[str, Any]:
    cases, differences = load_cases()
    agreed = {"answer_tag": 0, "raw": 0, "library": 0, "library_one_config": 0}
    wrong_ones = {"answer_tag": 0, "raw": 0}  # 1.0 where the suite expects 0
    disagree: list[str] = []
    start = time.perf_counter()
    for case in cases:
        gold, pred, expected = case["gold"], case["pred"], case["expected"]
        for name, response in (("answer_tag", f"<answer>{pred}</answer>"), ("raw", pred)):
            score = score_math_direct(response, gold, timeout_s=TIMEOUT_S).score
            agreed[name] += score == expected
            wrong_ones[name] += score == 1.0 and expected == 0
            if score != expected and case["source"] not in differences:
                disagree.append(f"{name} {case['source']}")
        agreed["library"] += library_verdict(gold, pred, case["config"]) == expected
        agreed["library_one_config"] += library_verdict(gold, pred, None) == expected
    return {
        "cases": len(cases),
        "agreed": agreed,
        "wrong_ones": wrong_ones,
        "deliberate_differences": len(differences),
        "undocumented_disagreements": disagree,
        "seconds": time.perf_counter() - start,
    }


def openai_solutions() -> dict[str, Any]:
    with gzip.open(DATA / "gsm8k_model_solutions.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    start = time.perf_counter()
    agreed = sum(
        (score_math_direct(r["solution"], r["gold"]).score == 1.0) == r["is_correct"] for r in rows
    )
    return {"solutions": len(rows), "agreed": agreed, "seconds": time.perf_counter() - start}


def _thin(v: str) -> str:
    """``12345`` → ``12,\\!345`` (LaTeX thousands separators)."""
    digits = v.replace(",", "")
    if not digits.isdigit() or len(digits) < 4:
        return v
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)]
    return ",\\!".join(groups)


# Each style: a response made of the rationale's steps ``{s}`` and the value ``{v}`` (``{v_thin}``:
# with LaTeX thousands separators; ``{v_double}``: twice the value, for a fraction equal to it).
STYLES: dict[str, str] = {
    "answer_tag": "<think>\n{s}\n</think>\n<answer>{v}</answer>",
    "answer_tag_latex": "<think>{s}</think>\n<answer>${v}$</answer>",
    "boxed": "{s}\nSo the answer is $\\boxed{{{v}}}$.",
    "boxed_final": "{s}\n\n**Final Answer**\n\\boxed{{{v}}}",
    "boxed_thin_space": "{s}\nThe total is $\\boxed{{{v_thin}}}$.",
    "hashes": "{s}\n#### {v}",
    "answer_is": "{s}\nThe answer is {v}.",
    "answer_colon": "{s}\nAnswer: {v}",
    "final_answer_latex": "{s}\nFinal Answer: The final answer is ${v}$. I hope it is correct.",
    "unit_word": "<think>{s}</think><answer>{v} dollars</answer>",
    "bold": "{s}\nTotal: **{v}**",
    "fraction": "<think>{s}</think>\n<answer>\\frac{{{v_double}}}{{2}}</answer>",
    "decimals": "{s}\nA: {v}.00",
    "last_number": "{s}\nSo she has {v} in the end",
    "inline_math": "{s}\nTherefore the result is ${v}$.",
}


def respond(style: str, steps: str, value: str) -> str:
    """The response of ``style`` for a rationale and a value."""
    return STYLES[style].format(s=steps, v=value, v_thin=_thin(value), v_double=2 * int(value))


def gsm8k_styles(n_groups: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in (gsm8k.default_dir() / "test.jsonl").open()][:n_groups]
    per_style: dict[str, list[int]] = {name: [0, 0] for name in STYLES}  # agreed, scored
    start = time.perf_counter()
    for row in rows:
        reference = row["answer"]
        value = reference.rsplit("####", 1)[1].strip().replace(",", "")
        steps = _CALC.sub("", reference.rsplit("####", 1)[0]).strip()
        wrong = str(int(value) + 1)
        for name in STYLES:
            for v, expected in ((value, 1.0), (wrong, 0.0)):
                score = score_math_direct(respond(name, steps, v), reference).score
                per_style[name][0] += score == expected
                per_style[name][1] += 1
    return {
        "problems": len(rows),
        "per_style": per_style,
        "agreed": sum(a for a, _ in per_style.values()),
        "scored": sum(n for _, n in per_style.values()),
        "seconds": time.perf_counter() - start,
    }


def table(r: dict[str, Any]) -> str:
    mv, oa, st = r["math_verify"], r["openai_solutions"], r["gsm8k_styles"]
    n = mv["cases"]
    lines = [
        "| material | agreed |",
        "| --- | ---: |",
        f"| Math-Verify's cases, ours, answer in `<answer>` | {mv['agreed']['answer_tag']} / {n} "
        f"({mv['wrong_ones']['answer_tag']} wrong 1.0s) |",
        f"| Math-Verify's cases, ours, raw response | {mv['agreed']['raw']} / {n} "
        f"({mv['wrong_ones']['raw']} wrong 1.0s) |",
        f"| Math-Verify's cases, the library alone, each case's configuration | "
        f"{mv['agreed']['library']} / {n} |",
        f"| Math-Verify's cases, the library alone, one configuration (ours) | "
        f"{mv['agreed']['library_one_config']} / {n} |",
        f"| deliberate differences (documented) | {mv['deliberate_differences']} |",
        f"| OpenAI's labelled GSM8K solutions | {oa['agreed']} / {oa['solutions']} |",
        f"| GSM8K test, {len(STYLES)} styles × right and wrong | {st['agreed']} / {st['scored']} |",
    ]
    for name, (agreed, scored) in st["per_style"].items():
        lines.append(f"| &nbsp;&nbsp;style `{name}` | {agreed} / {scored} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1319, help="GSM8K test problems to use")
    parser.add_argument("--json", type=Path, help="write the numbers here too")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    result = {
        "math_verify": math_verify_suite(),
        "openai_solutions": openai_solutions(),
        "gsm8k_styles": gsm8k_styles(args.groups),
    }
    print(table(result))
    undocumented = result["math_verify"]["undocumented_disagreements"]
    if undocumented:
        print("undocumented disagreements:", *undocumented, sep="\n  ")
    if args.json:
        record.write_result(args.json, result, indent=2)


if __name__ == "__main__":
    main()
