"""What a grader may import (``packages.py``): OpenAI's grader packages and what they need,
never the rest of the service's environment; and the grader's inputs (``grader.py``)."""

from __future__ import annotations

import sys

import pytest

from arbiter.services.sandbox import grader, packages
from arbiter.services.sandbox.settings import SandboxSettings


def test_the_graders_packages_and_their_dependencies_are_bound_nothing_else() -> None:
    names = {p.name for p in packages.grader_paths()}
    # each listed package, its native libraries, and what it imports in turn
    assert {"numpy", "numpy.libs", "scipy", "sympy", "mpmath", "pandas", "sklearn"} <= names
    assert {"rapidfuzz", "rouge_score", "nltk", "deepdiff", "jsonschema", "yaml"} <= names
    # the service's own packages and the rest of its environment stay hidden
    assert not names & {"arbiter", "fastapi", "uvicorn", "redis", "aiohttp", "torch", "httpx"}
    assert not any(n.endswith((".dist-info", ".pth")) for n in names)


def settings(**fields: object) -> SandboxSettings:
    return SandboxSettings.model_validate({"python": sys.executable, **fields})


def test_binds_are_read_only_under_the_jails_folder_with_one_thread_each() -> None:
    argv = packages.grader_binds(settings())
    binds = [argv[i + 1 : i + 3] for i, a in enumerate(argv) if a == "--ro-bind"]
    assert len(binds) == len(packages.grader_paths())
    assert all(dst == f"{packages.JAIL_SITE}/{src.rsplit('/', 1)[1]}" for src, dst in binds)
    envs = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}
    assert envs["OPENBLAS_NUM_THREADS"] == envs["OMP_NUM_THREADS"] == "1"


def test_another_python_gets_no_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    # a SANDBOX_PYTHON of another version could not load the compiled modules; no such
    # interpreter is installed here, so its answer is stood in for
    monkeypatch.setattr(packages, "_cache_tag", lambda python: "cpython-399")
    assert "--ro-bind" not in packages.grader_binds(settings())


def test_the_binds_can_be_turned_off() -> None:
    argv = packages.grader_binds(settings(grader_packages=False))
    assert "--ro-bind" not in argv and "OPENBLAS_NUM_THREADS" in argv


@pytest.mark.parametrize(
    ("response", "parsed"),
    [
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        ("42", 42),  # any JSON value, as OpenAI's output_json
        ("not json", None),
        ("[" * 40 + "]" * 40, None),  # nested past 32 levels
        ("[" * 100_000, None),  # past the parser's own recursion
    ],
)
def test_sample_holds_the_text_and_its_json(response: str, parsed: object) -> None:
    assert grader.sample(response) == {"output_text": response, "output_json": parsed}


def test_item_is_the_row_with_its_metadata_at_the_top_too() -> None:
    item = grader.item("Q", "ref", {"scale": 2, "shared": "recipe"}, {"shared": "row"})
    assert item["metadata"] == {"scale": 2, "shared": "row"}  # the row's keys win
    assert item["shared"] == "row" and item["scale"] == 2
    # the group's own fields are never shadowed by a metadata key of the same name
    assert grader.item("Q", None, {}, {"prompt": "x"})["prompt"] == "Q"


@pytest.mark.parametrize(
    ("grade", "why"),
    [(0.0, None), (1.0, None), (1.0000001, "outside"), (-0.0, None), (float("nan"), "finite")],
)
def test_a_grade_is_a_reward_only_inside_the_range(grade: float, why: str | None) -> None:
    reason = grader.out_of_range(grade, (0.0, 1.0))
    assert (reason is None) if why is None else (why in (reason or "")), reason
