"""Where the environments' tasks come from: read once at start-up, never downloaded.

GSM8K (``math``, ``calculator``, ``python``): its ``train.jsonl`` and ``test.jsonl`` from
``ENVS_GSM8K_DIR`` (default: ``arbiter.gsm8k``'s folder). Code (``code``): the rows checked
in beside this module, ``data/code_tasks.jsonl`` (HumanEval and MBPP; ``data/NOTICE.md``).
A caller's own ``task_spec`` is checked against the environment's task model
(``proto.envs.MathTask`` / ``CodeTask``): a clear 422 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from arbiter import gsm8k
from arbiter.errors import BadRequest, Unprocessable
from arbiter.proto.common import ArbiterModel
from arbiter.proto.envs import CodeTask, Split
from arbiter.services.common.app import field_path

T = TypeVar("T", bound=ArbiterModel)
CODE_TASKS = Path(__file__).parent / "data" / "code_tasks.jsonl"


@dataclass(frozen=True)
class TaskSet:
    """An environment's splits, each a list of task specs (plain JSON objects)."""

    splits: dict[str, list[dict[str, Any]]]

    def split_list(self) -> list[Split]:
        return [Split(name=name, type=_split_type(name)) for name in self.splits]

    def tasks(self, split: str) -> list[dict[str, Any]]:
        found = self.splits.get(split)
        if found is None:
            known = ", ".join(self.splits) or "none (give a task_spec)"
            raise BadRequest(
                f"split: unknown split {split[:64]!r}; known: {known}",
                param="split",
                code="unknown_split",
            )
        return found

    def task(self, split: str, index: int) -> dict[str, Any]:
        tasks = self.tasks(split)
        if index >= len(tasks):
            raise BadRequest(
                f"index: {index} is past the last task of split {split!r} ({len(tasks) - 1})",
                param="index",
                code="unknown_task",
            )
        return tasks[index]


def _split_type(name: str) -> Any:
    return name if name in ("train", "validation", "test") else "validation"


def load_gsm8k(folder: Path | None) -> tuple[TaskSet, str]:
    """GSM8K's splits and "ok"; without the data, no splits and why (the readiness check's
    "degraded: …": the math environments then take a caller's ``task_spec`` only)."""
    try:
        folder = gsm8k.require(folder)
    except FileNotFoundError as exc:
        return TaskSet({}), f"degraded: {exc}"
    splits: dict[str, list[dict[str, Any]]] = {}
    for split in ("train", "test"):
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        splits[split] = [
            {"id": f"gsm8k/{split}/{i}", "question": r["question"], "answer": r["answer"]}
            for i, r in enumerate(rows)
        ]
    return TaskSet(splits), "ok"


def load_code(path: Path = CODE_TASKS) -> TaskSet:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return TaskSet({"test": [CodeTask.model_validate(r).model_dump(mode="json") for r in rows]})


def checked(model: type[T], spec: dict[str, Any]) -> T:
    """``spec`` as ``model``, or 422 naming the first bad field as ``task_spec.<field>``."""
    try:
        return model.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ["task_spec", *field_path(first.get("loc", ()))])
        raise Unprocessable(f"{where}: {first['msg']}", param=where) from None
