"""The python environment's ``run``: an episode's cells as one ``code_tests`` job.

The sandbox runs only code and answers verdicts, never a program's output (its verdicts
cannot be forged by what a program prints). A cell's output reaches the episode through
the one channel a verdict has, a failed test's reason: the program (``program``) runs the
cells under ``contextlib.redirect_stdout``, keeps what the last one printed (and its
traceback), and answers ``arbiter_cell_output(k)`` with the k-th piece of it, base64 so
that the reason's whitespace folding leaves it whole; the tests (``TESTS``) assert each
piece is empty, so every non-empty piece comes back as ``assertion failed: <piece>``.

State across calls is the cells themselves, kept in the episode's Redis entry: each run
executes every earlier cell again, in order, with their output discarded, then the new
one. Its cost grows with the episode (n cells cost 1 + 2 + … + n runs); ``ENVS_MAX_CELLS``
bounds it. Nothing of another session is in the job: a cell sees only its own episode.
"""

from __future__ import annotations

import base64
import json
from typing import Any

PIECES = 16  # tests, one piece each
PIECE_CHARS = 280  # base64 characters a piece: the reason holds 300, less its prefix
OUTPUT_BYTES = PIECES * PIECE_CHARS * 3 // 4 - 64  # what is shown of a run's output
ENTRY = "arbiter_cell_output"
PREFIX = "assertion failed: "

TESTS = "".join(f'assert {ENTRY}({k}) == "", {ENTRY}({k})\n' for k in range(PIECES))

_PROGRAM = """\
import base64 as _b64, contextlib as _cl, io as _io, json as _json, traceback as _tb

_CELLS = _json.loads(_b64.b64decode("{cells}").decode("utf-8"))
_OUT = []


def _run():
    ns = {{"__name__": "__main__", "__builtins__": __builtins__}}
    buf = _io.StringIO()
    for i, src in enumerate(_CELLS):
        last = i == len(_CELLS) - 1
        buf = _io.StringIO() if last else buf
        with _cl.redirect_stdout(buf), _cl.redirect_stderr(buf):
            try:
                exec(compile(src, "<cell %d>" % (i + 1), "exec"), ns)
            except BaseException:
                if last:
                    _tb.print_exc(limit=-5)
        if not last:
            buf.seek(0)
            buf.truncate()
    data = buf.getvalue().encode("utf-8", "replace")
    if len(data) > {limit}:
        data = data[:{limit}] + ("\\n... (%d bytes more)" % (len(data) - {limit})).encode()
    text = _b64.b64encode(data).decode()
    _OUT.append([text[k : k + {piece}] for k in range(0, len(text), {piece})])


def {entry}(k):
    if not _OUT:
        # A test after the one whose process died running the cells (a loop past its CPU
        # time, memory) starts a fresh process: the mark keeps it from running them again.
        try:
            with open("/tmp/.arbiter-cells", "x"):
                pass
        except FileExistsError:
            return ""
        except OSError:
            pass
        _run()
    pieces = _OUT[0]
    return pieces[k] if k < len(pieces) else ""
"""


def program(cells: list[str]) -> str:
    """The job's program: ``cells`` run in order, the last one's output kept."""
    packed = base64.b64encode(json.dumps(cells).encode()).decode()
    return _PROGRAM.format(cells=packed, limit=OUTPUT_BYTES, piece=PIECE_CHARS, entry=ENTRY)


def reference() -> str:
    return json.dumps({"tests": TESTS, "entry_point": ENTRY})


def output(info: dict[str, Any]) -> tuple[str, bool]:
    """The last cell's output from ``code_tests``' notes on the job (``failed``: test
    index -> reason), and whether the cells ran to their end. A reason that is not a piece
    says why the program ended instead (killed past its CPU time, out of memory): that is
    the output then, and the cell is not kept (every later run would end the same way)."""
    failed = info.get("failed") or {}
    pieces: list[str] = []
    for k in range(PIECES):
        reason = failed.get(str(k))
        if reason is None:
            break
        reason = str(reason)
        if not reason.startswith(PREFIX):
            return f"[the run ended: {reason}; this cell is not kept]", False
        pieces.append(reason[len(PREFIX) :])
    data = "".join(pieces)
    try:
        return base64.b64decode(data, validate=True).decode("utf-8", "replace"), True
    except ValueError:
        return "[the run's output could not be read back; this cell is not kept]", False
