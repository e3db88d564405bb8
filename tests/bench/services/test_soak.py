"""The bounded fault-load run (bench/services/soak.py): under load, with a hostile client mixed in,
verify, then the embedding service, then Redis are killed (SIGKILL) and restarted. Every
score is right or null with its error entry, nothing the hostile client sends gets a 5xx,
each service recovers, and the cache holds no wrong value afterwards. Real processes."""

from __future__ import annotations

from bench.services.soak import run


def test_fault_load_keeps_every_score_right_or_explained() -> None:
    out = run(seconds=35, clients=3, with_faults=True)
    assert out["wrong"] == 0, out["wrong_examples"]
    assert out["wrong_in_cache_recheck"] == 0 and out["rechecked"] > 0
    assert out["scores"] > 0
    # well-behaved clients: scored (200), with nulls + errors during the outages, no 5xx
    assert set(out["statuses"]) == {"200"}, out["statuses"]
    assert "unexplained" not in out["nulls_by_kind"]
    bad = {k: n for k, n in out["hostile"].items() if k.split(":")[1].startswith("5")}
    assert not bad, out["hostile"]
    assert out["hostile"]["announced_50mb:413"] >= 1
    recovered = {f["service"]: f["recovery_s"] for f in out["faults"]}
    assert set(recovered) == {"verify", "embedding", "redis"}
    assert all(s is not None for s in recovered.values()), recovered  # each came back
