"""``arbiter graders validate FILE``: check OpenAI graders offline, as the gateway would
(the model, every template's variables, ``calculate_output``), before a training run sends
them. No gateway is needed.

FILE is JSON, JSON Lines or YAML holding one grader, a list of graders, ``{"graders":
[...]}``, an OpenAI fine-tuning job (its ``method.reinforcement.grader``), or a gateway
recipes file (``recipes:``, with grader components) — checked as the gateway loads it.
Exit status 0 when every grader is valid, 1 otherwise (each error names its field).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml


def _read(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return yaml.safe_load(text)  # JSON is YAML too


def _graders(doc: Any) -> list[tuple[str, Any]]:
    """(where, grader JSON) for every grader ``doc`` holds."""
    if isinstance(doc, dict) and isinstance(doc.get("method"), dict):  # a fine-tuning job
        reinforcement = doc["method"].get("reinforcement") or {}
        return [("method.reinforcement.grader", reinforcement.get("grader"))]
    if isinstance(doc, dict) and isinstance(doc.get("graders"), list):
        doc = doc["graders"]
    if isinstance(doc, list):
        return [(f"[{i}]", g) for i, g in enumerate(doc)]
    return [("grader", doc)]


def validate(path: Path) -> list[str]:
    """One line per grader: ``ok …`` or ``error …``."""
    from arbiter.errors import Unprocessable
    from arbiter.services.graders.spec import load

    try:
        doc = _read(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return [f"error {path}: cannot read: {exc}"]
    if isinstance(doc, dict) and "recipes" in doc:
        from arbiter.services.scoring.recipes import RecipeBook

        try:
            book = RecipeBook(path)
        except ValueError as exc:
            return [f"error {exc}"]
        return [f"ok recipe {r.ref.name} ({r.ref.fingerprint})" for r in book.named()]
    out = []
    for where, raw in _graders(doc):
        try:
            grader = load(raw, where)
        except Unprocessable as exc:
            out.append(f"error {exc.message}")
            continue
        out.append(f"ok {where}: {grader.name!r} ({grader.type})")
    return out


def _cmd_validate(args: argparse.Namespace) -> int:
    lines = validate(Path(args.file))
    for line in lines:
        print(line, file=sys.stderr if line.startswith("error") else sys.stdout)
    return 1 if any(line.startswith("error") for line in lines) else 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("graders", help="OpenAI graders: validate a file of them offline")
    graders = p.add_subparsers(dest="graders_command", required=True)
    v = graders.add_parser("validate", help="check graders as the gateway would (exit 1: not)")
    v.add_argument("file", help="JSON, JSON Lines or YAML: graders, a job, or a recipes file")
    v.set_defaults(func=_cmd_validate)
