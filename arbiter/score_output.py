"""The output file of ``arbiter score``: lines appended as groups are scored, the ids an
earlier run already scored (resume), and the summary of what the file holds.

Each scored group is one line, ``{"id", "rewards", "components", "masked", "errors", "info",
"recipe", "fingerprint"}``; a group whose request failed is ``{"id", "error": {"type",
"message"}}`` and is tried again by the next run. The summary counts this run's lines and the
groups earlier runs scored, and prints as a table (``rich``) or as plain lines.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from arbiter.proto.gateway import ScoreResponse


@dataclass
class Summary:
    """What the output file holds once this run is done (earlier runs' lines included)."""

    groups: int = 0
    resumed: int = 0  # scored by an earlier run, skipped now
    responses: int = 0
    masked: int = 0
    failed: int = 0  # groups whose request failed (written with "error")
    sums: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # item errors by kind
    cache_hits: int = 0  # this run's requests only
    cache_misses: int = 0

    def add(self, line: dict[str, Any]) -> None:
        if "error" in line:
            self.failed += 1
            self.errors[f"request: {line['error'].get('type', 'error')}"] += 1
            return
        self.groups += 1
        self.responses += len(line["rewards"])
        self.masked += sum(line["masked"])
        series = {"reward": line["rewards"], **line["components"]}
        for name, values in series.items():
            present = [v for v in values if v is not None]
            self.sums[name] += sum(present)
            self.counts[name] += len(present)
        for err in line.get("errors", []):
            self.errors[err["kind"]] += 1

    def rows(self) -> list[tuple[str, str]]:
        rows = [("groups scored", f"{self.groups} ({self.resumed} from an earlier run)"),
                ("responses", str(self.responses)),
                ("masked responses", str(self.masked)),
                ("failed groups", str(self.failed))]  # fmt: skip
        for name in self.sums:
            mean = self.sums[name] / self.counts[name] if self.counts[name] else None
            shown = "—" if mean is None else f"{mean:.4f}"
            rows.append((f"mean {name}", f"{shown} (n={self.counts[name]})"))
        for kind, n in sorted(self.errors.items()):
            rows.append((f"errors: {kind}", str(n)))
        looked = self.cache_hits + self.cache_misses
        ratio = f" ({self.cache_hits / looked:.0%})" if looked else ""
        rows.append(("cache hits (this run)", f"{self.cache_hits}{ratio}"))
        return rows


def read_done(path: Path, summary: Summary) -> set[str]:
    """Ids the output already holds scores for (failed lines are not done)."""
    done: set[str] = set()
    if not path.exists():
        return done
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut short by an interrupted run: scored again
            if "error" not in row and row.get("id") is not None:
                done.add(str(row["id"]))
                summary.add(row)
                summary.resumed += 1
    return done


class Writer:
    """Appends output lines as they come and keeps the summary up to date."""

    def __init__(self, out: IO[str], summary: Summary) -> None:
        self.out, self.summary = out, summary

    def write(self, line: dict[str, Any]) -> None:
        self.summary.add(line)
        self.out.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.out.flush()  # an interrupted run loses nothing that was scored

    def scored(self, out: ScoreResponse) -> None:
        self.summary.cache_hits += out.usage.cache_hits
        self.summary.cache_misses += out.usage.cache_misses
        for g in out.groups:
            line = g.model_dump(mode="json")
            line.update(recipe=out.recipe.name, fingerprint=out.recipe.fingerprint)
            self.write(line)

    def failed(self, gid: str, kind: str, message: str) -> None:
        self.write({"id": gid, "error": {"type": kind, "message": message}})


def print_summary(summary: Summary, console: Any) -> None:
    if console is None:
        for key, value in summary.rows():
            print(f"{key:<40} {value}", file=sys.stderr)
        return
    from rich.table import Table

    table = Table(title="arbiter score")
    table.add_column("")
    table.add_column("value", justify="right")
    for key, value in summary.rows():
        table.add_row(key, value)
    console.print(table)
