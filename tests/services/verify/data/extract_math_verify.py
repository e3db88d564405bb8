"""Rebuild ``math_verify_cases.jsonl`` from Math-Verify's own tests (Apache-2.0, see
``MATH_VERIFY_LICENCE`` beside this file).

Every ``@pytest.mark.parametrize`` case of Math-Verify's ``tests/`` that compares a gold
string with a prediction (``gold``, ``pred`` and ``expected``/``result``) becomes one line:
the strings, the expected verdict, and the configuration the test called the library with
(``match_types``, ``precision``, ``strict``, ``allow_set_relation_comp``), so a case run
under another configuration can be told apart. Tests that call library internals
(``sympy_expr_eq``, timeouts with mocks, string extraction) are not comparisons of two
strings and are left out.

    python tests/services/verify/data/extract_math_verify.py REPO_GIT_DIR [COMMIT]

(``REPO_GIT_DIR``: a clone of github.com/huggingface/Math-Verify, read with ``git show``.)
"""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("math_verify_cases.jsonl")
FILES = (
    "tests/test_all.py",
    "tests/test_boxed.py",
    "tests/test_numina_cases.py",
    "tests/test_open_thoughts.py",
    "tests/test_strict.py",
    "tests/test_yujianll.py",
)
# compare_strings' defaults (tests/test_all.py); a direct parse/verify uses the library's.
DEFAULTS: dict[str, Any] = {
    "match_types": ["latex", "expr"],
    "precision": 6,
    "strict": True,
    "allow_set_relation_comp": False,
}


def _value(node: ast.expr) -> Any:
    """A parametrize list: literals, plus f-strings over ``math`` (test_float_precision)."""
    code = compile(ast.Expression(node), "<parametrize>", "eval")
    return eval(code, {"__builtins__": {}, "math": math})


def _call_config(func: ast.FunctionDef, argnames: list[str]) -> dict[str, Any]:
    """The keywords of the test's compare_strings call: constants, or names of parameters."""
    config = dict(DEFAULTS)
    direct = False
    for node in ast.walk(func):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "verify":
            direct = True
        if node.func.id != "compare_strings":
            continue
        for kw in node.keywords:
            if kw.arg is None:
                continue
            if isinstance(kw.value, ast.Name) and kw.value.id in argnames:
                config[kw.arg] = "$" + kw.value.id  # filled per case
            else:
                config[kw.arg] = ast.literal_eval(kw.value)
    config["call"] = "parse+verify" if direct else "compare_strings"
    if direct:  # parse() and verify() with the library's defaults
        config["match_types"] = ["latex", "expr"]
        config["boxed_match_priority"] = 50
    else:
        config["boxed_match_priority"] = 0
    return config


def _plain_asserts(path: str, func: ast.FunctionDef) -> list[dict[str, Any]]:
    """``assert compare_strings("gold", "pred", ...) == 1`` in a test without parameters."""
    out: list[dict[str, Any]] = []
    for node in ast.walk(func):
        if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)):
            continue
        call = node.left
        if getattr(call.func, "id", "") != "compare_strings" or len(call.args) != 2:
            continue
        config = dict(DEFAULTS)
        config.update({kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg})
        config.update(call="compare_strings", boxed_match_priority=0)
        out.append(
            {
                "gold": ast.literal_eval(call.args[0]),
                "pred": ast.literal_eval(call.args[1]),
                "expected": int(ast.literal_eval(node.comparators[0])),
                "source": f"{path}::{func.name}[{len(out)}]",
                "config": config,
            }
        )
    return out


def cases(path: str, source: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for func in ast.parse(source).body:
        if not isinstance(func, ast.FunctionDef):
            continue
        if not func.decorator_list:
            out.extend(_plain_asserts(path, func))
        for deco in func.decorator_list:
            if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"):
                continue
            names = [n.strip() for n in ast.literal_eval(deco.args[0]).split(",")]
            if "gold" not in names or "pred" not in names:
                continue
            verdict = "expected" if "expected" in names else "result"
            config = _call_config(func, names)
            for i, row in enumerate(_value(deco.args[1])):
                values = dict(zip(names, row, strict=True))
                case_config = {
                    k: values[v[1:]] if isinstance(v, str) and v.startswith("$") else v
                    for k, v in config.items()
                }
                out.append(
                    {
                        "gold": values["gold"],
                        "pred": values["pred"],
                        "expected": int(values[verdict]),
                        "source": f"{path}::{func.name}[{i}]",
                        "config": case_config,
                    }
                )
    return out


def main() -> None:
    git_dir = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    rows: list[dict[str, Any]] = []
    for path in FILES:
        source = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rows.extend(cases(path, source))
    with OUT.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} cases -> {OUT}")


if __name__ == "__main__":
    main()
