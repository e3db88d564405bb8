"""The harness's pure parts, outside any sandbox: its JSON writer, the stdout comparison,
the seccomp filter's shape."""

from __future__ import annotations

import json
import struct

import pytest

from arbiter.services.sandbox.harness import dump
from arbiter.services.sandbox.runners import same_output
from arbiter.services.sandbox.seccomp import SECCOMP_DENY, seccomp_filter


@pytest.mark.parametrize(
    "value",
    [
        {"results": [[True, ""], [False, 'assertion failed: "x" != \\\\']], "cpu_s": 0.25},
        {"error": "tab\there, newline\nthere, bell\a, NUL\x00"},  # control characters
        {"error": "π ≠ 3 — ünïcödé 🙂"},  # kept as they are
        {"score": -1.5e-300, "n": 7, "none": None, "ok": False},
        [[], {}, [[1, 2], {"k": [True]}]],
    ],
)
def test_dump_writes_json_that_reads_back_the_same(value: object) -> None:
    assert json.loads(dump(value)) == value


def test_dump_replaces_what_json_cannot_carry() -> None:
    assert json.loads(dump({"s": "lone \ud800 surrogate"})) == {"s": "lone \ufffd surrogate"}
    assert json.loads(dump([float("nan"), float("inf")])) == [None, None]


@pytest.mark.parametrize(
    ("got", "want", "same"),
    [
        ("3\n", "3", True),  # a trailing newline
        ("1  \n2\n\n\n", "1\n2", True),  # trailing spaces on a line, trailing blank lines
        ("1\n2", "1\n 2", False),  # leading spaces count
        ("1 2", "1  2", False),  # so do inner ones
        ("", "\n", True),  # nothing and a blank line
        ("3", "4", False),
    ],
)
def test_stdout_is_compared_up_to_trailing_whitespace(got: str, want: str, same: bool) -> None:
    assert same_output(got, want) is same


@pytest.mark.parametrize("machine", sorted(SECCOMP_DENY))
def test_the_seccomp_filter_checks_the_arch_then_refuses_each_call(machine: str) -> None:
    code = seccomp_filter(machine)
    assert code is not None and len(code) % 8 == 0
    ops = [struct.unpack("<HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
    audit_arch, numbers = SECCOMP_DENY[machine]
    assert ops[0] == (0x20, 0, 0, 4) and ops[1][3] == audit_arch  # the arch, first
    assert ops[-1] == (0x06, 0, 0, 0x7FFF0000)  # allowed unless refused
    refused = {k for op, _, _, k in ops if op == 0x15} - {audit_arch}
    assert refused == set(numbers.values())


def test_an_unknown_architecture_gets_no_filter() -> None:
    assert seccomp_filter("sparc64") is None
