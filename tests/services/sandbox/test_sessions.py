"""Live interpreters (``/v1/sessions``) against a real sandbox service: a cell runs once, in
an interpreter that keeps its state; what it prints comes back as text; a cell past its
limits (CPU, wall clock, memory, processes) is an answer, never a hang, and the session
goes on (or starts over, and says so)."""

from __future__ import annotations

import time

from tests.services.sandbox.conftest import SESSION_ENV, Sessions

COUNTER = "n = globals().get('n', 0) + 1\nprint(n)\nopen('/tmp/runs', 'a').write('x')"
OUTPUT_BYTES = int(SESSION_ENV["SANDBOX_SESSION_OUTPUT_BYTES"])


def test_a_counter_cell_runs_once_a_call_and_its_state_persists(sessions: Sessions) -> None:
    sid = sessions.opened("counter")
    try:
        shown = [sessions.cell("counter", sid, COUNTER) for _ in range(3)]
        assert [c["stdout"] for c in shown] == ["1\n", "2\n", "3\n"]
        assert {c["status"] for c in shown} == {"ok"}
        assert all(0 < c["cpu_ms"] < 500 for c in shown), shown
        # each call ran the cell once: no earlier cell ran again (the file has three marks)
        runs = sessions.cell("counter", sid, "print(open('/tmp/runs').read())")
        assert runs["stdout"] == "xxx\n"
    finally:
        sessions.close("counter", sid)


def test_stdout_and_stderr_come_back_as_plain_text(sessions: Sessions) -> None:
    sid = sessions.opened("text")
    try:
        out = sessions.cell(
            "text", sid, "import sys\nprint('héllo ✓')\nprint('oops', file=sys.stderr)"
        )
        assert (out["stdout"], out["stderr"], out["status"]) == ("héllo ✓\n", "oops\n", "ok")
        # a traceback is stderr, as text, with the cell's own lines and no frame of ours
        sessions.cell("text", sid, "def half(x):\n    return x / 0\n")
        err = sessions.cell("text", sid, "print('before')\nhalf(3)")
        assert err["status"] == "error" and err["stdout"] == "before\n"
        assert err["stderr"].startswith("Traceback (most recent call last):\n"), err["stderr"]
        assert 'File "<cell 3>", line 2, in <module>' in err["stderr"]
        assert 'File "<cell 2>", line 2, in half\n    return x / 0' in err["stderr"]
        assert err["stderr"].endswith("ZeroDivisionError: division by zero\n")
        assert "harness" not in err["stderr"]
        syntax = sessions.cell("text", sid, "print(")
        assert syntax["status"] == "error" and "SyntaxError" in syntax["stderr"]
        # past the output limit: the first bytes, and how many more there were
        long = sessions.cell("text", sid, f"print('y' * {OUTPUT_BYTES + 99})")
        assert long["stdout"] == "y" * OUTPUT_BYTES and long["stdout_omitted"] == 100
        # what a cell prints is output, whatever it looks like; the one descriptor it has to
        # PID 1 (fd 3: "this cell is done") takes lines, never answers
        frame = '{"status": "ok", "stdout": "forged"}'
        forge = f"import os\nos.write(3, {frame!r}.encode() + b'\\n')\nprint({frame!r})"
        fake = sessions.cell("text", sid, forge)
        assert (fake["status"], fake["stdout"]) == ("ok", frame + "\n")
        fds = "import os\nfds = []\nfor fd in range(1024):\n    try: os.fstat(fd)\n"
        fds += "    except OSError: continue\n    fds.append(fd)\nprint(fds)"
        assert sessions.cell("text", sid, fds)["stdout"] == "[0, 1, 2, 3, 4]\n"
    finally:
        sessions.close("text", sid)


def test_a_cell_past_its_cpu_time_is_interrupted_and_the_state_stays(sessions: Sessions) -> None:
    sid = sessions.opened("cpu")
    try:
        sessions.cell("cpu", sid, "n = 41")
        began = time.monotonic()
        loop = sessions.cell("cpu", sid, "while True:\n    n += 0")
        assert time.monotonic() - began < 30
        assert loop["status"] == "interrupted", loop
        assert "1 s of CPU time" in loop["message"] and "KeyboardInterrupt" in loop["stderr"]
        assert 900 <= loop["cpu_ms"] < 3000
        assert sessions.cell("cpu", sid, "print(n + 1)")["stdout"] == "42\n"
    finally:
        sessions.close("cpu", sid)


def test_a_cell_that_ignores_the_interrupt_is_killed_and_says_so(sessions: Sessions) -> None:
    sid = sessions.opened("stubborn")
    try:
        sessions.cell("stubborn", sid, "n = 1")
        stubborn = (
            "while True:\n    try:\n        x = 0\n        while True:\n            x += 1\n"
            "    except BaseException:\n        pass"
        )
        killed = sessions.cell("stubborn", sid, stubborn)
        assert killed["status"] == "restarted", killed
        assert "ran past its 1 s of CPU time" in killed["message"]
        # the next cell runs in a fresh interpreter: the variables are gone
        fresh = sessions.cell("stubborn", sid, "print('n' in globals())")
        assert (fresh["status"], fresh["stdout"]) == ("ok", "False\n")
    finally:
        sessions.close("stubborn", sid)


def test_a_cell_that_sleeps_stops_at_the_wall_clock(sessions: Sessions) -> None:
    sid = sessions.opened("sleepy")
    try:
        began = time.monotonic()
        slept = sessions.cell("sleepy", sid, "import time\nx = 5\ntime.sleep(1000)")
        assert time.monotonic() - began < 30  # the backstop: 10 x 1 s + 1 s
        assert slept["status"] == "interrupted" and "wall-clock" in slept["message"]
        assert sessions.cell("sleepy", sid, "print(x)")["stdout"] == "5\n"
    finally:
        sessions.close("sleepy", sid)


def test_a_memory_bomb_is_a_memory_error(sessions: Sessions) -> None:
    sid = sessions.opened("memory")
    try:
        sessions.cell("memory", sid, "kept = 'still here'")
        one = sessions.cell("memory", sid, "x = bytearray(10 ** 10)")
        assert one["status"] == "error" and "MemoryError" in one["stderr"]
        grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"
        many = sessions.cell("memory", sid, grow)
        assert many["status"] == "error" and "MemoryError" in many["stderr"]
        # every process a cell forks stops at its own share: together within the session's
        forks = (
            "import os\nfor _ in range(2):\n    if os.fork() == 0:\n        b = []\n"
            "        try:\n            while True: b.append(bytearray(10 ** 7))\n"
            "        except MemoryError: os._exit(0)\n"
            "for _ in range(2): os.wait()\nprint('done')"
        )
        assert sessions.cell("memory", sid, forks)["stdout"] == "done\n"
        after = sessions.cell("memory", sid, "del chunks\nprint(kept)")
        assert (after["status"], after["stdout"]) == ("ok", "still here\n")
    finally:
        sessions.close("memory", sid)


def test_a_fork_bomb_is_contained(sessions: Sessions) -> None:
    sid = sessions.opened("forks")
    other = sessions.opened("bystander")
    try:
        bomb = sessions.cell("forks", sid, "import os\nwhile True:\n    os.fork()")
        assert bomb["status"] in ("error", "restarted"), bomb
        assert "BlockingIOError" in bomb["stderr"] or bomb["status"] == "restarted"
        # the session goes on (its processes reaped, or killed and the interpreter fresh)
        for _ in range(2):
            after = sessions.cell("forks", sid, "print('alive')")
            if after["status"] == "ok":
                break
        assert after["stdout"] == "alive\n", after
        # another session never noticed
        assert sessions.cell("bystander", other, "print(6 * 7)")["stdout"] == "42\n"
        # processes a cell leaves running hold the session's slots until the next cell
        # cannot start: then everything of the session is killed, and it starts over
        sleepers = (
            "import os, time\nfor _ in range(8):\n    try:\n        pid = os.fork()\n"
            "    except OSError: break\n    if pid == 0:\n        time.sleep(600)"
        )
        sessions.cell("forks", sid, sleepers)
        full = sessions.cell("forks", sid, "print(1)")
        assert full["status"] == "restarted" and "processes" in full["message"], full
        assert sessions.cell("forks", sid, "print(2)")["stdout"] == "2\n"
    finally:
        sessions.close("forks", sid)
        sessions.close("bystander", other)
