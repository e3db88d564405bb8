"""arbiter.gsm8k: the one answer to "where is GSM8K?" for the trainer, ``arbiter up``, the tiny
model, the tests and the benchmarks. (Installed from a wheel: tests/test_packaging.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiter import gsm8k

REPO = Path(__file__).resolve().parents[2]


def test_the_variable_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(gsm8k.ENV, str(tmp_path))
    assert gsm8k.default_dir() == tmp_path


def test_without_the_variable_it_is_beside_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gsm8k.ENV, raising=False)
    assert gsm8k.checkout() == REPO
    assert gsm8k.default_dir() == (REPO / ".." / "shared" / "data" / "gsm8k").resolve()


@pytest.mark.parametrize(
    ("env_is_the_path", "flag", "says"),
    [
        # a path from the default: say which variable and which flag would name it
        (False, "--data DIR", ["ARBITER_GSM8K_DIR", "--data DIR", "beside this checkout"]),
        # the variable names a folder without GSM8K: blame the variable, nothing else
        (True, "--data DIR", ["ARBITER_GSM8K_DIR must name the folder"]),
    ],
)
def test_a_missing_folder_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env_is_the_path: bool, flag: str,
    says: list[str],
) -> None:  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    if env_is_the_path:
        monkeypatch.setenv(gsm8k.ENV, str(empty))
    else:
        monkeypatch.delenv(gsm8k.ENV, raising=False)
    with pytest.raises(FileNotFoundError) as err:
        gsm8k.require(empty, flag)
    assert all(s in str(err.value) for s in says), str(err.value)
    assert str(empty) in str(err.value)


def test_a_folder_with_test_jsonl_is_returned(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("{}\n")
    assert gsm8k.require(tmp_path) == tmp_path
