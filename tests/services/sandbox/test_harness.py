"""The harness's pure parts, outside any sandbox: its JSON writer, the stdout comparison,
the seccomp filter's shape."""

from __future__ import annotations

import json
import struct

import pytest

from arbiter.services.sandbox.injail.harness import dump
from arbiter.services.sandbox.injail.runners import same_output
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


def run_filter(code: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel would do: classic BPF over ``struct seccomp_data`` (the few
    instructions the filter uses: load a word, jump if equal or greater, return)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    ops = [struct.unpack("<HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = ops[pc]
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("<I", data, k)[0]
        elif op in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE, K
            pc += jt if (acc == k if op == 0x15 else acc >= k) else jf
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"instruction {op:#x} not expected")
        pc += 1


@pytest.mark.parametrize("machine", sorted(SECCOMP_DENY))
def test_the_seccomp_filter_refuses_each_call_and_prlimit_of_another_process(machine: str) -> None:
    code = seccomp_filter(machine)
    assert code is not None and len(code) % 8 == 0
    arch, numbers, prlimit = SECCOMP_DENY[machine]
    allow, eperm, kill = 0x7FFF0000, 0x00050001, 0x80000000
    for number in numbers.values():
        assert run_filter(code, arch, number) == eperm
    assert run_filter(code, arch, 0) == allow  # read(2)
    assert run_filter(code, arch, numbers["ptrace"] + 1000) == allow
    assert run_filter(code, arch ^ 1, 0) == kill  # another ABI: killed
    assert run_filter(code, arch, prlimit, (0, 7)) == allow  # its own limits
    assert run_filter(code, arch, prlimit, (1, 7)) == eperm  # its runner's
    assert run_filter(code, arch, prlimit, (1 << 32, 7)) == eperm


def test_an_unknown_architecture_gets_no_filter() -> None:
    assert seccomp_filter("sparc64") is None
