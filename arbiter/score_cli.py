"""``arbiter score``, ``arbiter recipes``, ``arbiter health``: the gateway from a shell.

    arbiter score --recipe gsm8k --input groups.jsonl --output scores.jsonl [--concurrency 4]

Each input line is one group, ``{"id", "prompt", "reference", "responses": [...]}`` (a line
without an ``id`` is named ``line-<n>``, n counting from 1), or a HumanEval, MBPP or
stdin/stdout row with the policy's ``responses`` added, made into a group for the ``code``
recipes (``arbiter.rows``; ``--canonical`` scores the dataset's own solutions instead).
Groups go to the gateway in requests of ``--batch`` groups, at most ``--concurrency``
requests in flight, through the client (retries with backoff). Each scored group is
appended to the output as it arrives,
``{"id", "rewards", "components", "masked", "errors", "info", "recipe", "fingerprint"}``;
a group whose request failed is written as ``{"id", "error": {"type", "message"}}``. Run
again with the same output to resume: ids already scored there are skipped, failed ones
are tried again. At the end a summary: mean per component, masked responses, errors by
kind, cache hits. Progress shows groups done of the file's total (resumed ones counted),
the rate and the time left: a bar with ``rich`` installed (``pip install '.[cli]'`` in a
checkout), a line every few seconds without it. A recipe the gateway cannot serve (one
that needs a component it has not configured, e.g. ``gsm8k-dj`` without a judge) stops
the command at start with the reason and how to add it, before any group is sent.
Ctrl-C (SIGINT) or SIGTERM stops cleanly: what was scored stays written, the summary and
"interrupted: N/M groups scored; run the same command to resume" are printed, and the
exit status is 130.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from arbiter.client import DEFAULT_URL, ArbiterClient, RecipeArg, RetryPolicy, recipe_problem
from arbiter.errors import ArbiterError
from arbiter.proto.gateway import ScoreGroup
from arbiter.rows import RowError, as_group
from arbiter.score_output import Summary, Writer, print_summary, read_done

Item = tuple[str, dict[str, Any] | str]  # (id, group) or (id, why the line is bad)


def read_input(path: Path, done: set[str], canonical: bool = False) -> Iterator[Item]:
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("a line must be a JSON object (one group)")
                raw = as_group(raw, canonical)  # a dataset row (HumanEval, MBPP) as a group
                gid = str(raw["id"]) if raw.get("id") not in (None, "") else f"line-{n}"
            except RowError as exc:
                named = raw.get("id", raw.get("task_id"))
                gid = str(named) if named not in (None, "") else f"line-{n}"
                yield gid, f"line {n}: {exc.field}: {exc}"
                continue
            except ValueError as exc:
                yield f"line-{n}", f"line {n}: {exc}"
                continue
            if gid in done:
                continue
            try:
                group = ScoreGroup.model_validate({**raw, "id": gid}).model_dump(mode="json")
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                yield gid, f"line {n}: {where}: {first['msg']}"
                continue
            yield gid, group


def batches(items: Iterator[Item], size: int) -> Iterator[list[Item]]:
    batch: list[Item] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def count_lines(path: Path) -> int:
    with path.open() as f:
        return sum(1 for line in f if line.strip())


def load_recipe(value: str) -> RecipeArg:
    """A recipe name, or a JSON/YAML file with an inline recipe."""
    path = Path(value)
    if path.suffix in (".json", ".yaml", ".yml") and path.is_file():
        import yaml

        loaded: dict[str, Any] = yaml.safe_load(path.read_text())
        return loaded
    return value


def _client(args: argparse.Namespace) -> ArbiterClient:
    retries = getattr(args, "retries", None)
    retry = None if retries is None else RetryPolicy(attempts=retries + 1)
    return ArbiterClient(args.url, api_key=args.api_key, retry=retry)


async def score_file(
    args: argparse.Namespace, writer: Writer, done: set[str], advance: Any
) -> None:
    recipe = load_recipe(args.recipe)
    async with _client(args) as client:
        # The start check: one GET /v1/recipes. A recipe the gateway does not have, or one
        # that needs a component it has not configured (no judge), stops here with why.
        try:
            listing = await client.arecipe_list()
        except ArbiterError as exc:
            raise SystemExit(f"arbiter score: {exc.message}") from exc
        names = [r.name for r in listing.recipes]
        if isinstance(recipe, str) and recipe not in names:
            raise SystemExit(f"arbiter score: recipe {recipe!r} is not on the gateway "
                             f"({', '.join(names)})")  # fmt: skip
        try:
            problem = recipe_problem(listing, recipe)
        except ArbiterError as exc:  # an inline recipe that does not validate
            raise SystemExit(f"arbiter score: --recipe {args.recipe}: {exc.message}") from None
        if problem is not None:
            raise SystemExit(f"arbiter score: {problem.message}")
        todo = batches(read_input(Path(args.input), done, args.canonical), args.batch)

        async def worker() -> None:
            for batch in todo:  # one shared iterator: each batch goes to one worker
                good = [(gid, g) for gid, g in batch if isinstance(g, dict)]
                for gid, why in batch:
                    if isinstance(why, str):
                        writer.failed(gid, "invalid_request_error", why)
                if good:
                    try:
                        res = await client.ascore([g for _, g in good], recipe, args.on_error)
                    except ArbiterError as exc:
                        for gid, _ in good:
                            writer.failed(gid, exc.type, exc.message)
                    else:
                        writer.scored(res)
                advance(len(batch))

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))


INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT


async def until_signal(work: Any) -> bool:
    """Run ``work`` (a coroutine); SIGINT or SIGTERM cancels it. True when interrupted."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
        return False
    except asyncio.CancelledError:
        if task.cancelled():  # our own signal handler, not a cancellation from outside
            return True
        raise
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


class PlainProgress:
    """Without rich: one line on stderr every ``every`` seconds (never when quiet)."""

    def __init__(self, done: int, total: int, quiet: bool, every: float = 5.0) -> None:
        self.done, self.total, self.quiet, self.every = done, total, quiet, every
        self.start_done, self.start = done, time.monotonic()
        self.last = self.start

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.quiet or (now - self.last < self.every and self.done < self.total):
            return
        self.last = now
        rate = (self.done - self.start_done) / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta = "?" if left != left else f"{int(left) // 60}:{int(left) % 60:02d}"
        print(f"scoring groups {self.done:,}/{self.total:,}  {rate:.1f} groups/s  ETA {eta}",
              file=sys.stderr)  # fmt: skip


def _rich_progress(console: Any) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
    )


def _console(quiet: bool) -> Any:
    """A rich console on stderr, or None (quiet, or the `cli` extra not installed)."""
    if quiet:
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(stderr=True)


def cmd_score(args: argparse.Namespace) -> int:
    if args.concurrency < 1 or args.batch < 1 or args.retries < 0:
        raise SystemExit("arbiter score: --concurrency and --batch must be >= 1, --retries >= 0")
    source, output = Path(args.input), Path(args.output)
    if not source.is_file():
        raise SystemExit(f"arbiter score: --input {args.input}: no such file")
    summary = Summary()
    done = read_done(output, summary)
    total = max(count_lines(source), len(done))  # the file's groups, resumed ones included
    console = _console(args.quiet)
    if not args.quiet:  # which gateway: on a shared machine, not always the one meant
        url = (args.url or os.environ.get("ARBITER_URL") or DEFAULT_URL).rstrip("/")
        print(f"arbiter score: gateway {url}", file=sys.stderr)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a") as out:
        if out.tell() and not output.read_bytes().endswith(b"\n"):
            out.write("\n")  # the last run stopped mid-line: start a fresh one
        writer = Writer(out, summary)
        if console is None:
            plain = PlainProgress(len(done), total, args.quiet)
            interrupted = asyncio.run(until_signal(score_file(args, writer, done, plain.advance)))
        else:
            with _rich_progress(console) as progress:
                task = progress.add_task("scoring groups", total=total, completed=len(done),
                                         rate="")  # fmt: skip

                def advance(n: int) -> None:
                    progress.advance(task, n)
                    speed = progress.tasks[task].speed
                    progress.update(task, rate=f"{speed:.1f} groups/s" if speed else "")

                interrupted = asyncio.run(until_signal(score_file(args, writer, done, advance)))
    print_summary(summary, console)
    if interrupted:
        print(f"interrupted: {summary.groups:,}/{total:,} groups scored; "
              "run the same command to resume", file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    return 1 if summary.failed else 0


def cmd_recipes(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            recipes = client.recipes()
    except ArbiterError as exc:
        print(f"arbiter recipes: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in recipes], indent=2))
        return 0
    width = max(60, shutil.get_terminal_size().columns - 4)
    for r in recipes:
        parts = " + ".join(f"{c.weight:g}·{c.name}" for c in r.components)
        state = "available" if r.available else "NOT AVAILABLE"
        print(f"{r.name:<20} {parts:<60} {r.fingerprint[:19]}…  {state}")
        if not r.available:  # why, and how to add what is missing
            print(textwrap.fill(r.reason or "", width, initial_indent="    ",
                                subsequent_indent="    ", break_on_hyphens=False,
                                break_long_words=False))  # fmt: skip
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    client = _client(args)
    try:
        health = client.health()
    except ArbiterError as exc:
        print(f"unreachable: {exc.message}", file=sys.stderr)
        return 2
    finally:
        client.close()
    print(f"{client.base_url}: {'ready' if health.ready else 'NOT READY'}")
    for name, state in health.checks.items():
        print(f"  {name:<12} {state}")
    return 0 if health.ready else 1


def add_commands(sub: Any) -> None:
    """Add ``score``, ``recipes`` and ``health`` to the ``arbiter`` parser's subcommands."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", default=None, help="gateway (default: $ARBITER_URL or :8000)")
        p.add_argument("--api-key", default=None, help="default: $ARBITER_API_KEY")
        p.add_argument("--retries", type=int, default=5, help="retries of a retryable failure")

    p = sub.add_parser("score", help="score a JSONL file of groups (resumable)")
    p.add_argument("--recipe", required=True, help="a recipe name, or a JSON/YAML inline one")
    p.add_argument("--input", required=True, help="JSONL, one group per line")
    p.add_argument("--output", required=True, help="JSONL; appended to, resumed from")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    p.add_argument("--batch", type=int, default=16, help="groups per request (16)")
    p.add_argument("--on-error", choices=("mask", "fail"), default="mask")
    p.add_argument("--quiet", action="store_true", help="no progress bar; plain summary")
    p.add_argument(
        "--canonical", action="store_true",
        help="HumanEval/MBPP rows: score the dataset's own solution (each should score 1.0)",
    )  # fmt: skip
    common(p)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser(
        "recipes", help="list the gateway's named recipes, each available here or not (and why)"
    )
    p.add_argument("--json", action="store_true", help="as JSON")
    common(p)
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("health", help="is the gateway ready? (exit 0 ready, 1 not, 2 down)")
    common(p)
    p.set_defaults(func=cmd_health)
