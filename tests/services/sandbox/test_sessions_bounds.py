"""Live interpreters' bounds, against a real sandbox service: idle ones are reaped, a team
at its count is refused (and no other team), sessions cannot see each other, one cell at a
time, and a restart loses them with a clear answer."""

from __future__ import annotations

import concurrent.futures
import time

from tests.services.sandbox.conftest import SESSION_ENV, Sessions

IDLE_S = float(SESSION_ENV["SANDBOX_SESSION_IDLE_S"])
PER_TEAM = int(SESSION_ENV["SANDBOX_SESSION_PER_TEAM"])


def test_an_idle_session_is_reaped(sessions: Sessions) -> None:
    sid = sessions.opened("idle")
    assert sessions.cell("idle", sid, "x = 1")["status"] == "ok"
    time.sleep(IDLE_S + 2.5)  # the reaper looks every IDLE_S / 4
    r = sessions.run("idle", sid, "print(x)")
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found", r.text


def test_a_team_at_its_count_is_refused_and_no_other_team(sessions: Sessions) -> None:
    mine = [sessions.opened("busy-team") for _ in range(PER_TEAM)]
    other = None
    try:
        refused = sessions.open("busy-team")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "session_limit"
        assert "SANDBOX_SESSION_PER_TEAM" in refused.json()["error"]["message"]
        other = sessions.opened("quiet-team")  # another team opens as before
        assert sessions.cell("quiet-team", other, "print(1)")["stdout"] == "1\n"
        assert sessions.close("busy-team", mine.pop()).status_code == 200
        mine.append(sessions.opened("busy-team"))  # a closed one makes room
    finally:
        for sid in mine:
            sessions.close("busy-team", sid)
        if other is not None:
            sessions.close("quiet-team", other)


def test_two_sessions_cannot_see_each_other(sessions: Sessions) -> None:
    secret = "s3cret-" + "q" * 12
    a, b = sessions.opened("alice"), sessions.opened("alice")
    try:
        keep = f"token = {secret!r}\nopen('/tmp/token', 'w').write(token)"
        sessions.cell("alice", a, keep)
        probe = (
            "import os, glob\n"
            "print('token' in globals(), os.path.exists('/tmp/token'))\n"
            "hits = []\n"
            "for p in glob.glob('/tmp/**', recursive=True) + glob.glob('/dev/shm/**'):\n"
            "    try:\n"
            f"        if os.path.isfile(p) and {secret!r}.encode() in open(p, 'rb').read():\n"
            "            hits.append(p)\n"
            "    except OSError: pass\n"
            "alive = []\n"
            "for pid in range(2, 200):\n"
            "    try: os.kill(pid, 0)\n"
            "    except OSError: continue\n"
            "    alive.append(pid)\n"
            "print(hits, len(alive) <= 2)\n"
        )
        seen = sessions.cell("alice", b, probe)
        assert secret not in seen["stdout"]
        assert seen["stdout"] == "False False\n[] True\n", seen
        # another team's session id is unknown to this team
        r = sessions.run("mallory", a, "print(token)")
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        assert sessions.close("mallory", a).status_code == 404
        assert sessions.cell("alice", a, "print(token)")["stdout"] == secret + "\n"
    finally:
        sessions.close("alice", a)
        sessions.close("alice", b)


def test_one_cell_at_a_time_and_a_closed_session_is_gone(sessions: Sessions) -> None:
    sid = sessions.opened("turns")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            sessions.run, "turns", sid, "import time\ntime.sleep(1.5)\nprint('slow')"
        )
        time.sleep(0.5)
        r = sessions.run("turns", sid, "print('fast')")
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy", r.text
        assert slow.result().json()["stdout"] == "slow\n"
    assert sessions.close("turns", sid).json() == {"id": sid, "closed": True}
    r = sessions.run("turns", sid, "print(1)")
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


def test_a_restart_loses_the_sessions_with_a_clear_answer(sessions: Sessions) -> None:
    sid = sessions.opened("restart")
    assert sessions.cell("restart", sid, "x = 1")["status"] == "ok"
    sessions.proc.stop()
    sessions.proc.start()
    sessions.proc.wait_ready(60)
    r = sessions.run("restart", sid, "print(x)")
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "session_not_found" and "restarted" in error["message"]
    fresh = sessions.opened("restart")  # a new one opens as before
    assert sessions.cell("restart", fresh, "print(2)")["stdout"] == "2\n"
    sessions.close("restart", fresh)
