"""The hostile multi-team soak (bench/services/soak_teams.py), bounded: an OpenRLHF-style team with
200 concurrent one-sample requests, a team uploading slowly, one leaving on purpose and a
normal one, on a stack with keys, while verify and Redis are killed and restarted. Every
request is answered, no score is wrong, and the quota holds what the leaver can cause.
Real processes.

Then sharing at the edges (bench/services/soak_edges.py, its SHORT sizes) on `arbiter up --keys`:
a team with verify history behind a newcomer's slow items, a newcomer's diversity behind a
bulk embedder, a 120/min team flooding while both Redis are stopped, a team filling the state
Redis with stored answers. Each case's bound is the full run's (10 s, quota + 10 %, the
ledger exact, no 5xx, nothing of another team's state lost, the byte budget reached and
held, the veteran's reward within one item's deadline); only the counts are smaller, and the
veteran is also compared with a team without history sent at the same moment."""

from __future__ import annotations

from bench.services.soak_edges import SHORT, bounds, run_edges
from bench.services.soak_teams import run


def test_teams_under_pressure_get_answers_and_no_wrong_score() -> None:
    out = run(seconds=40, baseline_s=3)
    teams = out["teams"]
    assert out["wrong"] == 0, {k: t["wrong_examples"] for k, t in teams.items()}
    # every request of the well-behaved teams is answered: scores, or an envelope saying
    # why (503/504 while verify is down), never a 500. A connection the server closed as
    # the client reused it (HTTP/1.1 keep-alive's race, which a client retries) is allowed
    # once in a thousand.
    for name in ("openrlhf", "normal"):
        answers = teams[name]["answers"]
        statuses = {k for k in answers if k.isdigit()}
        assert statuses <= {"200", "503", "504"}, (name, answers)
        assert answers.get("200", 0) > 0, (name, answers)
        dropped = sum(n for k, n in answers.items() if not k.isdigit())
        assert dropped <= sum(answers.values()) // 1000, (name, answers)
    assert "unexplained" not in teams["normal"]["nulls_by_reason"]
    # the slow uploader is cut off at the body deadline, every time
    assert set(teams["slow"]["answers"]) == {"408"}, teams["slow"]["answers"]
    # the leaver is charged for what it started, within its quota
    quota = out["leaver_quota"]
    assert 0 < quota["charged"] <= quota["allowed_in_run"], quota
    assert {"verify", "redis"} == {f["service"] for f in out["faults"]}


def test_sharing_at_the_edges_holds_every_bound() -> None:
    out = run_edges(SHORT)
    missed = [line for held, line in bounds(out) if not held]
    assert not missed, "\n".join(missed)
    v = out["veteran_newcomer"]
    assert v["reward"] == 1.5 and v["newcomer_pending_at_send"], v  # answered behind the load
    # a team with history waits as a team without it, sent at the same moment (before the
    # fair-share policy: 11.2 s against 4.1 s, or null at 30 s)
    assert v["waited_s"] <= v["no_history_waited_s"] + 1.0, v
