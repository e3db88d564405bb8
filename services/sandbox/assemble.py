"""The program built from a response: what runs against its group's tests.

Pure functions, no I/O. A response is code alone, or prose with fenced code blocks
(```` ```python … ``` ````, any tag or none). The datasets' own conventions decide the program:

- **A body-only completion** (HumanEval's own format: the prompt ends with the signature and
  docstring, the completion is the body): when no block of the response defines the entry
  point and the group's prompt does, the program is ``prompt + response``, as human-eval's
  harness builds it (``problem["prompt"] + completion``; a fenced body: ``prompt + block``).
- **Python tests**: the last block that defines the entry point (for tests without one, a
  name the tests use and do not define), plus what it needs from the prompt and the other
  blocks: the top-level definitions and imports of the names it uses and does not define,
  and of those they use in turn (evalplus's sanitizer does this with tree-sitter; here
  ``ast``). Every other statement of the other blocks — a usage example calling or printing
  the function — is left out, so a correct solution followed by an example still runs alone.
- **stdin/stdout tests**: the last block that reads input (``input(``, ``sys.stdin``,
  ``open(0)``, ``fileinput``), or a later block that calls its function that reads
  (``main()`` after ``def main(): … input() …``), plus what it needs, likewise.
- Otherwise the last block that is Python, else the last block, else the whole response.
  Code without fences in prose ("Here it is:" then code then "It runs in O(n).") is the
  longest run of its lines that parses, starting with a statement at column 0.

Blocks are dedented. The prompt lends definitions only when it parses as Python (HumanEval's
prompts do: imports, helpers such as ``poly``; a prose prompt does not).
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
PROMPT_DEF = re.compile(r"^def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.MULTILINE)
READS_INPUT = re.compile(
    r"\binput\s*\(|\bstdin\b|\bopen\s*\(\s*0\s*[,)]|\bfileinput\b|\bos\.read\s*\(\s*0\b"
)
BUILTINS = frozenset(dir(builtins))
MAX_PULLED = 1000  # statements taken from the prompt and other blocks, at most
MAX_SEARCH_CHARS = 200_000  # parsed looking for the code in an unfenced response, at most
# a line that may begin the code of an unfenced response: a statement at column 0
CODE_START = re.compile(
    r"(?:async\s+def|def|class|import|from|for|while|if|try|with|print)\b|@"
    r"|[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_]\w*)*\s*=[^=]"
)
DEFINITIONS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
)


@dataclass(frozen=True)
class Wanted:
    """What a group's tests need of a program: computed once per group (``wanted``)."""

    stdio: bool = False
    entry: str | None = None  # the function the tests call (HumanEval's entry point)
    names: frozenset[str] = frozenset()  # names the tests use and do not define themselves
    prompt: str = ""

    @cached_property
    def prompt_tree(self) -> ast.Module | None:
        """The prompt parsed, once for all of a group's responses (``None``: not Python)."""
        return _parse(self.prompt) if self.prompt.strip() else None


def wanted(reference: str | None, prompt: str, entry_point: str | None, stdio: bool) -> Wanted:
    """The group's needs: its entry point (``params.entry_point``, else the reference's own,
    else the last function the prompt defines, as ``programs.parse_reference`` resolves it)
    and the names its Python tests use without defining them."""
    if stdio:
        return Wanted(stdio=True, prompt=prompt)
    tests, own_entry = _tests_and_entry(reference or "")
    tree = _parse(tests)
    # builtins too: MBPP/126's function is named sum, which the tests call
    names = _free_names([tree], builtin=True) if tree is not None else frozenset()
    entry = entry_point or own_entry
    if entry is None and (found := prompt_entry(prompt)) is not None:
        # HumanEval-style tests call check(<entry>); plain asserts name what they call
        check = tree is not None and any(
            isinstance(s, ast.FunctionDef) and s.name == "check" for s in tree.body
        )
        entry = found if check or found in names else None
    if entry is not None:
        names |= {entry}
    return Wanted(entry=entry, names=frozenset(names), prompt=prompt)


def prompt_entry(prompt: str) -> str | None:
    """HumanEval prompts end with the function to write: the last ``def`` at column 0."""
    names = PROMPT_DEF.findall(prompt)
    return names[-1] if names else None


def fenced_blocks(response: str) -> list[str]:
    """The response's fenced code blocks, dedented, in order."""
    return [textwrap.dedent(b) for b in FENCE.findall(response)]


def extract_program(response: str, want: Wanted | None = None) -> str:
    """The program to run for ``response`` against tests that need ``want`` (module doc)."""
    want = want or Wanted()
    raw = FENCE.findall(response)
    texts = [textwrap.dedent(b) for b in raw] or [_unfenced(response)]
    blocks = [_Source(text, _parse(text)) for text in texts]
    parsed = [(i, b) for i, b in enumerate(blocks) if b.tree is not None]
    if want.stdio:
        main = _reader(parsed)
    else:
        main = _last(i for i, b in parsed if want.entry in _binds(b.tree))
        if main is None and (body := _body_only(response, raw, want)) is not None:
            return body
        if main is None:
            main = _last(i for i, b in parsed if want.names & _binds(b.tree))
    if main is None:
        main = _last(i for i, _ in parsed)
    if main is None:
        return texts[-1]
    library = [_Source(want.prompt, want.prompt_tree)]
    library += [b for i, b in enumerate(blocks) if i != main]
    return _with_needs(blocks[main], library, set() if want.stdio else set(want.names))


# ------------------------------------------------------------------ choosing the block


@dataclass(frozen=True)
class _Source:
    text: str
    tree: ast.Module | None


def _reader(parsed: list[tuple[int, _Source]]) -> int | None:
    """The last block that reads input, or a later one that calls its function that does
    (``def main(): … input() …`` in one block, ``main()`` in the next)."""
    found = _last(i for i, b in parsed if READS_INPUT.search(b.text))
    if found is None:
        return None
    source = dict(parsed)[found]
    assert source.tree is not None
    readers = {
        stmt.name
        for stmt in source.tree.body
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and READS_INPUT.search(_segment(source.text, stmt))
    }
    later = _last(
        i for i, b in parsed if i > found and b.tree is not None and readers & _free_names([b.tree])
    )
    return found if later is None else later


def _body_only(response: str, raw: list[str], want: Wanted) -> str | None:
    """``prompt + completion`` when the prompt defines the entry point and that program is
    Python: the completion is the response, or its last fenced block as written."""
    if want.stdio or want.entry is None or want.entry not in PROMPT_DEF.findall(want.prompt):
        return None
    program = want.prompt + (raw[-1] if raw else response)
    try:  # compiled, not only parsed: a misplaced __future__ import or a stray return
        compile(program, "<program>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return program


def _unfenced(response: str) -> str:
    """Code without fences: all of it when it parses, else the longest run of lines that
    parses and starts with a statement at column 0 (a definition, an import, an assignment:
    prose before and after the code left out; evalplus's ``code_extract`` tries every run,
    this one parses at most ``MAX_SEARCH_CHARS`` characters)."""
    if _parse(response) is not None:
        return response
    lines = response.splitlines(keepends=True)
    offset = [0]  # offset[i]: where line i starts; code[i]: non-blank lines before line i
    code = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))
        code.append(code[-1] + bool(line.strip()))
    best, best_size, budget = response, 0, MAX_SEARCH_CHARS
    for start in (i for i, line in enumerate(lines) if CODE_START.match(line)):
        for end in range(len(lines), start, -1):
            size = code[end] - code[start]
            length = offset[end] - offset[start]
            if size <= best_size or length > budget:
                break
            budget -= length
            text = response[offset[start] : offset[end]]
            if _parse(text) is not None:
                best, best_size = text, size
                break
        if budget <= 0 or code[-1] - code[start] <= best_size:
            break
    return best


def _last(indices: Iterable[int]) -> int | None:
    found = None
    for i in indices:
        found = i
    return found


# ------------------------------------------------------------------ what a block needs


def _with_needs(main: _Source, library: list[_Source], names: set[str]) -> str:
    """``main`` preceded by the library's definitions of what it needs and does not define
    (a ``from __future__`` import of ``main`` stays first)."""
    assert main.tree is not None
    index: dict[str, tuple[int, ast.stmt]] = {}  # name -> its last definition in the library
    for k, source in enumerate(library):
        for stmt in source.tree.body if source.tree is not None else []:
            future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
            if isinstance(stmt, DEFINITIONS) and not future:
                for name in _binds_stmt(stmt):
                    index[name] = (k, stmt)
    if not index:  # nothing to lend (one block, a prose prompt): the usual case, no walk
        return main.text
    own = _binds(main.tree)
    need = (_free_names([main.tree]) | names) - own
    pulled: dict[tuple[int, int], tuple[int, ast.stmt]] = {}
    todo = sorted(need)
    seen = set(todo) | own
    while todo and len(pulled) < MAX_PULLED:
        found = index.get(todo.pop())
        if found is None:
            continue
        k, stmt = found
        pulled[(k, stmt.lineno)] = found
        for name in sorted(_free_names([stmt]) - seen):
            seen.add(name)
            todo.append(name)
    if not pulled:
        return main.text
    parts = [_segment(library[k].text, stmt) for _, (k, stmt) in sorted(pulled.items())]
    head, tail = _split_future(main)
    return head + "\n".join(parts) + "\n\n" + tail


def _segment(text: str, stmt: ast.stmt) -> str:
    """A top-level statement's lines as written, decorators included."""
    decorators = getattr(stmt, "decorator_list", [])
    start = min([stmt.lineno, *(d.lineno for d in decorators)])
    lines = text.splitlines(keepends=True)[start - 1 : stmt.end_lineno]
    return "".join(lines).rstrip("\n") + "\n"


def _split_future(source: _Source) -> tuple[str, str]:
    """(its ``from __future__`` imports and what precedes them, the rest): those imports
    must stay at the top of the program."""
    assert source.tree is not None
    end = 0
    for stmt in source.tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            end = stmt.end_lineno or stmt.lineno
    if not end:
        return "", source.text
    lines = source.text.splitlines(keepends=True)
    head = "".join(lines[:end])
    return (head if head.endswith("\n") else head + "\n"), "".join(lines[end:])


def _binds(tree: ast.Module | None) -> set[str]:
    """The names a module binds at its top level (inside if/try/with/for/while too)."""
    out: set[str] = set()
    for stmt in tree.body if tree is not None else []:
        out |= _binds_stmt(stmt)
    return out


def _binds_stmt(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    out: set[str] = set()
    for node in _outside_scopes(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif node is not stmt and isinstance(node, ast.stmt):
            out |= _binds_stmt(node)
    return out


def _outside_scopes(stmt: ast.stmt) -> Iterator[ast.AST]:
    """``stmt`` and its nodes, not entering nested functions, classes or lambdas (a nested
    statement is yielded, its inside is left to ``_binds_stmt``)."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        if node is not stmt and isinstance(node, ast.stmt):
            continue
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.Lambda | ast.comprehension):
                stack.append(child)


def _free_names(trees: list[ast.AST], builtin: bool = False) -> frozenset[str]:
    """Names read and never bound anywhere in ``trees`` (scopes not told apart: a name bound
    anywhere counts as defined), builtins left out unless ``builtin``."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    return frozenset(loaded - bound if builtin else loaded - bound - BUILTINS)


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text, "<response>")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _tests_and_entry(reference: str) -> tuple[str, str | None]:
    """The Python test code and the entry point a reference names (its JSON object shape)."""
    text = reference.strip()
    if text[:1] == "{":
        try:
            doc = json.loads(text)
        except ValueError:
            return text, None
        if isinstance(doc, dict):
            tests, entry = doc.get("tests"), doc.get("entry_point")
            return (
                tests if isinstance(tests, str) else "",
                entry if isinstance(entry, str) and entry.isidentifier() else None,
            )
    return text, None
