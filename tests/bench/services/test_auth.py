"""bench.services.auth runs end to end at a tiny size: every variant answers 200 and is timed."""

from __future__ import annotations

from bench.services.auth import run


def test_auth_bench_times_every_variant() -> None:
    out = run(requests=5, n_groups=4)
    assert set(out["latency_ms"]) == {
        "off miss", "off hit", "teams miss", "teams hit",
        "teams+idem miss", "teams+idem hit", "teams replay",
    }  # fmt: skip
    assert all(v["n"] == 5 and v["p50_ms"] > 0 for v in out["latency_ms"].values())
    assert set(out["added_p50_ms"]) == {"miss", "hit", "miss+idem", "hit+idem"}
