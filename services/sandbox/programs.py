"""What runs: the tests taken from a reference (the program: ``assemble.py``).

Pure functions, no I/O. The tests are prepared here, in the service, once per group: each
test becomes a unit the harness can number, skip and report on (``harness.py``).

- A reference is Python test code, a JSON list of ``{"input", "output"}`` pairs, or a JSON
  object ``{"tests": <either>, "entry_point": "name"}``.
- Python test code: every top-level statement that contains an ``assert`` is one test; in
  HumanEval-style code (``def check(candidate)``) those of ``check``'s body are, and
  ``check(<entry point>)`` is called after them (a ``check`` with no such statement is one
  test: the call). Other statements (imports, helpers, setup) run where they stand.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
from dataclasses import dataclass, replace
from typing import Any

PROMPT_DEF = re.compile(r"^def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.MULTILINE)
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class ReferenceError_(ValueError):
    """The reference holds no usable tests: the group's fault, not the response's."""


@dataclass(frozen=True)
class TestPlan:
    """A group's tests, ready for the harness: ``kind`` "tests" (Python) or "stdio"."""

    kind: str
    n_tests: int
    code: str = ""  # kind "tests": the prepared test code
    cases: tuple[dict[str, str], ...] = ()  # kind "stdio": the pairs
    names: tuple[str, ...] = ()  # kind "tests": the names they use and do not define
    prompt: str = ""  # kind "tests": the prompt, when it defines helpers the tests use
    entry: str = ""

    def job(self) -> dict[str, Any]:
        if self.kind == "stdio":
            # the inputs only: what a program could find in its memory it could print
            return {"kind": "stdio", "cases": [{"input": c["input"]} for c in self.cases]}
        # the tests travel apart: only the sandbox's checker reads them (jail.job_bytes)
        secret = {
            "tests": self.code,
            "names": list(self.names),
            "prompt": self.prompt,
            "entry": self.entry,
        }
        return {"kind": "tests", "secret": secret, "n_tests": self.n_tests}


def parse_reference(
    reference: str | None, prompt: str, entry_point: str | None, max_tests: int
) -> TestPlan:
    """The group's tests; ``ReferenceError_`` says why there are none usable."""
    text = (reference or "").strip()
    if not text:
        raise ReferenceError_("the reference holds no tests")
    own_entry: str | None = None
    tests: Any = text
    if text[0] in "[{":
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None  # Python code may start with [ or { too (a list display)
        if isinstance(doc, dict):
            tests, own_entry = doc.get("tests"), doc.get("entry_point")
            if own_entry is not None and not (
                isinstance(own_entry, str) and IDENTIFIER.match(own_entry)
            ):
                raise ReferenceError_("reference entry_point: not a Python identifier")
        elif isinstance(doc, list):
            tests = doc
    if isinstance(tests, list):
        return _stdio(tests, max_tests)
    if not isinstance(tests, str) or not tests.strip():
        raise ReferenceError_("reference tests: expected Python test code or a list of pairs")
    entry = entry_point or own_entry or _prompt_entry(prompt)
    plan = _python(tests, entry, max_tests)
    if entry and _prompt_helpers(prompt, entry, plan.names):
        plan = replace(plan, prompt=prompt, entry=entry)
    return plan


def _prompt_helpers(prompt: str, entry: str, names: tuple[str, ...]) -> bool:
    """Whether the prompt is code defining a function the tests use besides the entry point
    (HumanEval/32's ``poly``, /38's ``encode_cyclic``): the checker runs the prompt's own
    (``checker.prompt_helpers``), so a response cannot redefine what judges it."""
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }
    return bool((defined - {entry}) & set(names))


def _stdio(pairs: list[Any], max_tests: int) -> TestPlan:
    if not pairs:
        raise ReferenceError_("the reference's list of stdin/stdout pairs is empty")
    if len(pairs) > max_tests:
        raise ReferenceError_(f"{len(pairs)} tests; the limit is {max_tests}")
    cases = []
    for i, pair in enumerate(pairs):
        if not (
            isinstance(pair, dict)
            and isinstance(pair.get("input", ""), str)
            and isinstance(pair.get("output"), str)
        ):
            raise ReferenceError_(f'reference test {i}: expected {{"input": str, "output": str}}')
        cases.append({"input": pair.get("input", ""), "output": pair["output"]})
    return TestPlan(kind="stdio", n_tests=len(cases), cases=tuple(cases))


def _prompt_entry(prompt: str) -> str | None:
    """HumanEval prompts end with the function to write: the last ``def`` at column 0."""
    names = PROMPT_DEF.findall(prompt)
    return names[-1] if names else None


def _python(source: str, entry: str | None, max_tests: int) -> TestPlan:
    try:
        tree = ast.parse(source, "<tests>")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ReferenceError_(f"the reference's test code does not parse: {exc}") from None
    try:  # rewriting and unparsing recurse: a deep expression parses, then overflows them
        return _prepare(tree, entry, max_tests)
    except RecursionError:
        raise ReferenceError_("the reference's test code is nested too deeply") from None


def _prepare(tree: ast.Module, entry: str | None, max_tests: int) -> TestPlan:
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    counter = _Counter()
    names = set(_free_names(tree))  # the tests' own, before the harness's wrapping
    sources = {n for n in names if not hasattr(builtins, n)} | ({entry} if entry else set())
    if check is not None:
        sources |= {a.arg for a in check.args.args}  # ``candidate``
    counter.tainted = _tainted(tree, sources)
    if check is not None:
        if entry is None:
            raise ReferenceError_(
                "HumanEval-style tests need an entry point: set params.entry_point, give "
                '{"tests": ..., "entry_point": ...} as the reference, or define the function '
                "in the prompt"
            )
        check.body = _wrap_all(check.body, counter)
        call: ast.stmt = ast.Expr(
            ast.Call(ast.Name("check", ast.Load()), [ast.Name(entry, ast.Load())], [])
        )
        if counter.n == 0:  # no assert at check's top level: the whole call is one test
            call = _wrap(call, counter)
        tree.body.append(call)
        names.add(entry)
    else:
        tree.body = _wrap_all(tree.body, counter)
    if counter.n == 0:
        raise ReferenceError_(
            "the reference's test code holds no assert statement that depends on the program"
        )
    if counter.n > max_tests:
        raise ReferenceError_(f"{counter.n} tests; the limit is {max_tests}")
    return TestPlan(
        kind="tests",
        n_tests=counter.n,
        code=ast.unparse(ast.fix_missing_locations(tree)),
        names=tuple(sorted(names)),
    )


def _free_names(tree: ast.Module) -> tuple[str, ...]:
    """The names the tests use and never bind (the entry point, the program's helpers):
    in the sandbox each is the program's, called in its process (``checker.Remote``);
    builtins are left to the checker, which knows its interpreter's."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif (isinstance(node, ast.ExceptHandler) and node.name) or (
            isinstance(node, ast.MatchAs | ast.MatchStar) and node.name
        ):
            bound.add(node.name)
    return tuple(sorted(n for n in loaded - bound if not n.startswith("__arbiter_")))


class _Counter:
    n = 0
    tainted: frozenset[str] = frozenset()  # the names whose values come from the program


def _reads(node: ast.AST, names: frozenset[str] | set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _tainted(tree: ast.Module, sources: set[str]) -> frozenset[str]:
    """The names whose values may come from the program (static, flow-insensitive): the
    program's own (``sources``), and a name bound from an expression that reads one, or
    handed to a call or a method in a statement that does (``sort(xs)``, ``xs.append(f(1))``:
    it may be changed there). An assert that reads none of them and made no call of its own
    checks only the tests' values (``y = 2; assert y == 2``)."""
    tainted = set(sources)
    statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)][:20_000]
    for _ in range(100):  # each pass adds a name, or it is done
        before = len(tainted)
        for st in statements:
            _taint_step(st, tainted)
        if len(tainted) == before:
            break
    return frozenset(tainted)


def _taint_step(st: ast.stmt, tainted: set[str]) -> None:
    if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        if _reads(st, tainted):  # calling it may call the program
            tainted.add(st.name)
        return
    if isinstance(st, ast.For | ast.AsyncFor):
        heads: list[ast.AST] = [st.iter]
        touched: list[ast.AST] = [st.target]
    elif isinstance(st, ast.With | ast.AsyncWith):
        heads = touched = list(st.items)
    elif isinstance(st, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Expr):
        heads = touched = [st]
    else:
        return
    if not any(_reads(h, tainted) for h in heads):
        return
    for node in touched:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
                tainted.add(n.id)
            elif isinstance(n, ast.Call):
                roots = [a for a in n.args if isinstance(a, ast.Name)]
                func = n.func
                while isinstance(func, ast.Attribute | ast.Subscript):
                    func = func.value
                    if isinstance(func, ast.Name):
                        roots.append(func)
                tainted.update(r.id for r in roots)
            elif isinstance(n, ast.Attribute | ast.Subscript) and isinstance(n.ctx, ast.Store):
                root = n.value
                while isinstance(root, ast.Attribute | ast.Subscript):
                    root = root.value
                if isinstance(root, ast.Name):
                    tainted.add(root.id)


def _has_assert(node: ast.stmt) -> bool:
    """An assert in ``node``, outside any nested function or class (those only define)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return False
    stack: list[ast.AST] = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, ast.Assert):
            return True
        for child in ast.iter_child_nodes(cur):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stack.append(child)
    return False


def _wrap_all(body: list[ast.stmt], counter: _Counter) -> list[ast.stmt]:
    kept = [s for s in body if not _checks_nothing(s)]
    return [_wrap(s, counter) if _has_assert(s) else s for s in kept] or [ast.Pass()]


def _checks_nothing(stmt: ast.stmt) -> bool:
    """An assert whose condition names nothing (``assert True``, ``assert 1 == 1``, a
    constant message aside): it holds whatever the program does, so it is no test
    (HumanEval's ``check`` functions have such lines). Dropped before the tests are
    numbered; an assert that makes no call to the program is caught as it runs."""
    return isinstance(stmt, ast.Assert) and not any(
        isinstance(n, ast.Name) for n in ast.walk(stmt.test)
    )


def _wrap(stmt: ast.stmt, counter: _Counter) -> ast.stmt:
    """``if begin(i, dep): try: <stmt> except BaseException as e: fail(i, e) else:
    pass(i)``; ``dep``: the statement reads a name whose value comes from the program, so
    it counts even when it makes no call itself."""
    i = counter.n
    dep = _reads(stmt, counter.tainted)
    counter.n += 1

    def hook(name: str, *args: ast.expr) -> ast.Expr:
        return ast.Expr(ast.Call(ast.Name(name, ast.Load()), [ast.Constant(i), *args], []))

    handler = ast.ExceptHandler(
        type=ast.Name("BaseException", ast.Load()),
        name="__arbiter_e__",
        body=[hook("__arbiter_fail__", ast.Name("__arbiter_e__", ast.Load()))],
    )
    guarded = ast.Try(
        body=[stmt], handlers=[handler], orelse=[hook("__arbiter_pass__")], finalbody=[]
    )
    args: list[ast.expr] = [ast.Constant(i), ast.Constant(dep)]
    begin = ast.Call(ast.Name("__arbiter_begin__", ast.Load()), args, [])
    return ast.If(test=begin, body=[guarded], orelse=[])
