"""Pictures of the service benchmarks, drawn from their recorded results.

Each figure plots a number that moves with load or size (throughput against batch size,
latency against the machine's load, programs/s against parallelism, latency through
faults) from a results file in ``bench/results/``, and names the machine and the file in
its title, so a picture in the docs can be traced to the run behind it. Nothing is
measured here.

    python -m bench.services.plots                      # every figure, into docs/assets/
    python -m bench.services.plots sandbox --results bench/results/sandbox.json

A benchmark script run with ``--json FILE --plot`` calls ``render(name, FILE)`` after the
run to redraw its figure from the new numbers.
The ``*_series`` functions turn a results file into the plotted numbers (tested in
tests/bench/test_plots.py); the ``_draw_*`` functions only draw.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
ASSETS = REPO / "docs" / "assets"
DPI = 100

Series = dict[str, list[tuple[float, float]]]


def _points(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return sorted(pairs)


# --- the numbers ---------------------------------------------------------------------------


def embedding_series(res: dict[str, Any]) -> Series:
    """Raw ``encode`` texts/s against batch size, and each service setting's texts/s
    (at its own max batch size) beside the raw figure interleaved with it."""
    raw = _points([(float(bs), float(v)) for bs, v in res["raw_sweep"].items()])
    out: Series = {"raw encode, sweep": raw}
    for name, row in res["service"].items():
        worker, _, mbt = name.partition(" x1 mbt")
        label = f"service, encode in a {worker}"
        out.setdefault(label, []).append((float(mbt), float(row["texts_per_s"])))
        raw_label = f"raw encode beside it ({worker} runs)"
        out.setdefault(raw_label, []).append((float(mbt), float(row["raw_texts_per_s"])))
    return {k: _points(v) for k, v in out.items()}


def _gateway_run(res: dict[str, Any]) -> dict[str, Any]:
    """One run as ``python -m bench.services.gateway --json`` writes it, in the shape of a
    run of the collected file (gateway_aiohttp.json)."""
    return {
        "load_before": res["load_before"],
        "added_p50_ms": {k: v["p50_ms"] for k, v in res["added_latency_ms"].items()},
        "cached_throughput_aiohttp_gateway": res.get("cached_throughput", {}),
    }


def gateway_series(res: dict[str, Any]) -> tuple[Series, Series]:
    """Per run, against the 1-minute load average before it: the gateway's added p50 (ms)
    in each case, and cached-hit responses/s for 1 and 8 groups per request."""
    added: Series = {}
    cached: Series = {}
    for run in res.get("runs") or [_gateway_run(res)]:
        load = float(run["load_before"][0])
        for case, ms in run["added_p50_ms"].items():
            if case.startswith("gateway"):
                label = case.removeprefix("gateway").strip().replace("+redis", "Redis,")
                added.setdefault(label.strip(", ") or case, []).append((load, float(ms)))
        for shape, row in run.get("cached_throughput_aiohttp_gateway", {}).items():
            cached.setdefault(shape, []).append((load, float(row["responses_per_s"])))
    return ({k: _points(v) for k, v in added.items()}, {k: _points(v) for k, v in cached.items()})


SANDBOX_RUNS = ("parallel_equals_cores", "parallel_equals_cores_repeat", "parallel_4x_cores")


def sandbox_series(res: dict[str, Any]) -> dict[str, Series]:
    """Per workload: programs/s against programs in parallel, sandbox and plain
    subprocess (both runs at parallel = cores are kept)."""
    out: dict[str, Series] = {}
    # the collected file holds several runs; one run of the script is a run by itself
    runs = [res[key] for key in SANDBOX_RUNS if key in res] or [res]
    for run in runs:
        parallel = float(run["workers"])  # programs the service runs at once
        for workload, row in run["workloads"].items():
            series = out.setdefault(workload, {})
            for side, label in (("sandbox", "sandbox"), ("plain_subprocess", "plain subprocess")):
                series.setdefault(label, []).append((parallel, float(row[side]["programs_per_s"])))
    return {w: {k: _points(v) for k, v in s.items()} for w, s in out.items()}


def soak_series(res: dict[str, Any]) -> tuple[Series, list[tuple[str, float, float]]]:
    """p50 and p99 latency (s) of the well-behaved clients second by second, and each
    fault as (service, killed at, answering again at)."""
    lat: Series = {"p50": [], "p99": []}
    for row in res["timeline"]:
        for key in ("p50", "p99"):
            ms = row.get(f"{key}_ms")
            if ms is not None:
                lat[key].append((float(row["t"]), float(ms) / 1000))
    faults = [
        (f["service"], float(f["killed_at_s"]), float(f["restarted_at_s"]) + float(f["recovery_s"]))
        for f in res.get("faults", [])
    ]
    return lat, faults


VERIFY_CASES = {
    "http_fast_path_group": ("plain numbers without math-verify (default)", 8),
    "http_fast_path_batch": ("plain numbers without math-verify (default)", 512),
    "http_no_fast_path_group": ("math-verify on every item", 8),
    "http_no_fast_path_batch": ("math-verify on every item", 512),
}


def verify_series(res: dict[str, Any]) -> Series:
    """Responses/s through HTTP against responses per request (a group of 8, or a batch of
    512), with the fast path (plain-number answers decided without math-verify) and
    without it, one point per run."""
    out: Series = {}
    for run in res.get("runs", [res]):
        for key, (label, size) in VERIFY_CASES.items():
            if key in run:
                out.setdefault(label, []).append((float(size), float(run[key]["rps"])))
    return {k: _points(v) for k, v in out.items()}


# --- the pictures --------------------------------------------------------------------------


def _figure(ncols: int, title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(min(5.2 * ncols, 12), 3.6), squeeze=False)
    fig.suptitle(title, fontsize=9)
    return fig, list(axes[0])


def _save(fig: Any, out: Path) -> Path:
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


def _lines(ax: Any, series: Series, **kw: Any) -> None:
    for label, pts in series.items():
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label, **kw)


def _size_axis(ax: Any, series: Series) -> None:
    """A log-2 x axis whose ticks are the measured sizes, written as plain numbers."""
    sizes = sorted({x for pts in series.values() for x, _ in pts})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
    ax.minorticks_off()


def _title(res: dict[str, Any], path: Path, default_machine: str) -> str:
    machine = res.get("machine") or res.get("run", {}).get("machine") or default_machine
    machine = str(machine).split(". ")[0][:90]
    return f"{machine} — {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"


def _plot(
    ax: Any,
    series: Series,
    xlabel: str,
    ylabel: str,
    sizes: bool = False,
    log_y: bool = False,
    **kw: Any,
) -> None:
    """``series`` as lines on ``ax``, its axes labelled, y from 0 (or on a log scale);
    ``sizes``: the x axis is the measured sizes on a log-2 scale."""
    _lines(ax, series, **kw)
    if sizes:
        _size_axis(ax, series)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def _draw_embedding(res: dict[str, Any], path: Path, out: Path) -> Path:
    fig, (ax,) = _figure(1, _title(res, path, "GPU"))
    xlabel = "batch size (texts per forward pass / per service batch)"
    _plot(ax, embedding_series(res), xlabel, "texts/s", sizes=True)
    return _save(fig, out)


def _draw_gateway(res: dict[str, Any], path: Path, out: Path) -> Path:
    added, cached = gateway_series(res)
    fig, (a, b) = _figure(2, _title(res, path, "2-core x86 VM"))
    load = "load average before the run (2 cores)"
    _plot(a, added, load, "added p50 over calling verify directly (ms)", linestyle="")
    _plot(b, cached, load, "cached hits: responses/s (16 clients)", linestyle="")
    return _save(fig, out)


def _draw_sandbox(res: dict[str, Any], path: Path, out: Path) -> Path:
    series = sandbox_series(res)
    machine = res.get("parallel_equals_cores", res).get("machine", "2-core VM")
    fig, axes = _figure(len(series), _title({"machine": machine}, path, ""))
    for ax, (workload, s) in zip(axes, series.items(), strict=True):
        ax.set_title(workload, fontsize=9)
        _plot(ax, s, "programs in parallel", "programs/s", sizes=True)
    return _save(fig, out)


def _draw_soak(res: dict[str, Any], path: Path, out: Path) -> Path:
    lat, faults = soak_series(res)
    fig, (ax,) = _figure(1, _title(res, path, f"{res.get('cpus', 2)}-core x86 VM"))
    ylabel = "latency of well-behaved clients (s)"
    _plot(ax, lat, "seconds into the run", ylabel, markersize=3)
    for i, (service, killed, back) in enumerate(faults):
        ax.axvspan(killed, back, color=f"C{i + 2}", alpha=0.15, label=f"{service} down")
    return _save(fig, out)


def _draw_verify(res: dict[str, Any], path: Path, out: Path) -> Path:
    fig, (ax,) = _figure(1, _title(res, path, "2-core x86 VM"))
    xlabel = "responses per request (16 clients for 8, 2 for 512)"
    ylabel = "responses/s through HTTP"
    _plot(ax, verify_series(res), xlabel, ylabel, sizes=True, log_y=True, linestyle="")
    return _save(fig, out)


# name -> (draw, default results file, picture)
FIGURES: dict[str, tuple[Callable[[dict[str, Any], Path, Path], Path], str, str]] = {
    "embedding": (_draw_embedding, "embedding_gpu_h200.json", "bench_embedding_batch.png"),
    "gateway": (_draw_gateway, "gateway_aiohttp.json", "bench_gateway_load.png"),
    "sandbox": (_draw_sandbox, "sandbox.json", "bench_sandbox_parallel.png"),
    "soak": (_draw_soak, "soak_faults.json", "bench_soak_faults.png"),
    "verify": (_draw_verify, "verify_workers.json", "bench_verify_size.png"),
}


def render(name: str, results: Path | None = None, out_dir: Path = ASSETS) -> Path:
    """Draw figure ``name`` from ``results`` (its recorded file by default)."""
    draw, default, picture = FIGURES[name]
    path = (results or RESULTS / default).resolve()
    return draw(json.loads(path.read_text()), path, out_dir / picture)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"of {', '.join(FIGURES)}; default: all")
    parser.add_argument("--results", type=Path, help="results file (with one name)")
    parser.add_argument("--out", type=Path, default=ASSETS, help="folder for the PNGs")
    args = parser.parse_args()
    names = args.names or list(FIGURES)
    if unknown := sorted(set(names) - set(FIGURES)):
        parser.error(f"unknown figure {', '.join(unknown)}: choose from {', '.join(FIGURES)}")
    if args.results and len(names) != 1:
        parser.error("--results needs exactly one figure name")
    for name in names:
        print(render(name, args.results, args.out))


if __name__ == "__main__":
    main()
