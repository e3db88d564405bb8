"""bench/services/plots.py: the plotted numbers are the recorded ones, and every figure draws.

The series are read from the checked-in results files, so a figure in the docs can be traced
to a number in bench/results/ and a renamed key in a results file fails here, not silently
as an empty picture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.services import plots


def _recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((plots.RESULTS / plots.FIGURES[name][1]).read_text())
    return data


def test_embedding_raw_sweep_is_plotted_against_batch_size() -> None:
    res = _recorded("embedding")
    series = plots.embedding_series(res)
    assert series["raw encode, sweep"] == sorted(
        (float(bs), v) for bs, v in res["raw_sweep"].items()
    )
    # each service setting is placed at its own max batch size, beside its raw figure
    thread = series["service, encode in a thread"]
    assert [x for x, _ in thread] == [128.0, 256.0]
    assert thread[0][1] == pytest.approx(res["service"]["thread x1 mbt128"]["texts_per_s"])


def test_gateway_points_are_placed_at_each_runs_load() -> None:
    res = _recorded("gateway")
    added, cached = plots.gateway_series(res)
    # only the aiohttp gateway's cases, not the old transport's ("before ...")
    assert set(added) == {"no-cache math", "no-cache gsm8k", "Redis, math", "Redis, gsm8k"}
    assert all(len(pts) == len(res["runs"]) for pts in added.values())
    first = res["runs"][0]
    point = (float(first["load_before"][0]), first["added_p50_ms"]["gateway no-cache math"])
    assert point in added["no-cache math"]
    assert set(cached) == {"1 group/request", "8 group/request"}


def test_gateway_reads_one_run_as_the_script_writes_it() -> None:
    # python -m bench.services.gateway --json: one run, added latency as {p50_ms, p99_ms}
    one = {
        "load_before": [3.5, 3.0, 2.5],
        "added_latency_ms": {
            "gateway no-cache math": {"p50_ms": 1.8, "p99_ms": 2.6},
            "gateway+redis gsm8k": {"p50_ms": 2.4, "p99_ms": 6.0},
        },
        "cached_throughput": {"8 group/request": {"responses_per_s": 56333.0}},
    }
    added, cached = plots.gateway_series(one)
    assert added == {"no-cache math": [(3.5, 1.8)], "Redis, gsm8k": [(3.5, 2.4)]}
    assert cached == {"8 group/request": [(3.5, 56333.0)]}


def test_sandbox_programs_per_second_against_parallelism() -> None:
    res = _recorded("sandbox")
    series = plots.sandbox_series(res)
    assert set(series) == {"trivial", "test_heavy", "stdio"}
    trivial = series["trivial"]["sandbox"]
    # two runs at 2 in parallel (= cores), one at 8
    assert [x for x, _ in trivial] == [2.0, 2.0, 8.0]
    got = dict(series["trivial"]["plain subprocess"])[8.0]
    want = res["parallel_4x_cores"]["workloads"]["trivial"]["plain_subprocess"]["programs_per_s"]
    assert got == pytest.approx(want)


def test_sandbox_reads_one_run_as_the_script_writes_it() -> None:
    one = _recorded("sandbox")["parallel_4x_cores"]  # the script's own output shape
    series = plots.sandbox_series(one)
    assert [x for x, _ in series["stdio"]["sandbox"]] == [8.0]


def test_soak_skips_seconds_without_answers_and_spans_each_fault() -> None:
    res = {
        "timeline": [
            {"t": 1.0, "p50_ms": None, "p99_ms": None},
            {"t": 2.0, "p50_ms": 1500.0, "p99_ms": 3000.0},
        ],
        "faults": [
            {"service": "verify", "killed_at_s": 9.0, "restarted_at_s": 12.0, "recovery_s": 3.1}
        ],
    }
    lat, faults = plots.soak_series(res)
    assert lat == {"p50": [(2.0, 1.5)], "p99": [(2.0, 3.0)]}
    assert faults == [("verify", 9.0, pytest.approx(15.1))]


def test_verify_series_reads_every_run_and_a_single_run() -> None:
    res = _recorded("verify")
    series = plots.verify_series(res)
    default = series["plain numbers without math-verify (default)"]
    assert len(default) == 2 * len(res["runs"])
    assert plots.verify_series(res["runs"][0])["math-verify on every item"] == sorted(
        [(8.0, res["runs"][0]["http_no_fast_path_group"]["rps"]),
         (512.0, res["runs"][0]["http_no_fast_path_batch"]["rps"])]
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_every_figure_draws_a_png(name: str, tmp_path: Path) -> None:
    out = plots.render(name, out_dir=tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size < 200_000  # small enough to commit


def test_unknown_figure_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["plots", "latency"])
    with pytest.raises(SystemExit) as exc:
        plots.main()
    assert exc.value.code == 2
