"""``arbiter keys create|list|revoke`` and the keys file: the key is shown once and never
stored, hashes verify in constant time against the right secret only, bad files say where."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from arbiter.cli import main
from arbiter.keys import DEV_SECRET, KeyIndex, create, hash_key, key_id, load, revoke

SECRET = "s" * 40


def test_create_prints_the_key_once_and_stores_only_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.yaml"
    monkeypatch.setenv("GATEWAY_KEY_SECRET", SECRET)
    args = ["keys", "create", "--team", "alpha", "--file", str(path), "--name", "trainer"]
    assert main([*args, "--responses-per-minute", "600", "--recipes", "gsm8k, gsm8k-dj"]) == 0
    out = capsys.readouterr()
    key = out.out.strip()  # stdout holds the key alone: KEY=$(arbiter keys create …)
    assert key_id(key) is not None
    assert "shown only now" in out.err and "development" not in out.err
    text = path.read_text()
    assert key not in text and key.rsplit("_", 1)[1] not in text
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # hashes only; the gateway's user reads it
    path.chmod(0o640)
    create(path, "alpha", secret=SECRET)
    assert oct(path.stat().st_mode & 0o777) == "0o640"  # a mode set by hand is kept
    doc = load(path)
    assert doc.teams["alpha"].responses_per_minute == 600
    assert doc.teams["alpha"].recipes == ["gsm8k", "gsm8k-dj"]
    assert doc.keys[0].hash == hash_key(SECRET, key) and doc.keys[0].name == "trainer"
    principal = KeyIndex(doc, SECRET).verify(key)
    assert principal is not None and principal.team == "alpha" and not principal.admin
    assert KeyIndex(doc, DEV_SECRET).verify(key) is None  # another secret: no match

    assert main(["keys", "list", "--file", str(path)]) == 0
    listed = capsys.readouterr().out
    assert doc.keys[0].id in listed and "alpha" in listed and key not in listed


def test_revoke_and_admin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys.yaml"
    key, record = create(path, "ops", secret=SECRET, admin=True)
    other, _ = create(path, "ops", secret=SECRET)
    index = KeyIndex(load(path), SECRET)
    found = index.verify(key)
    assert found is not None and found.admin
    assert main(["keys", "revoke", record.id, "--file", str(path)]) == 0
    assert "revoked" in capsys.readouterr().out
    index = KeyIndex(load(path), SECRET)
    assert index.verify(key) is None  # revoked
    assert index.verify(other) is not None  # the team's other key still works
    assert revoke(path, record.id).revoked is not None  # revoking twice is harmless


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("keys: [1]\n", "keys.0"),  # a record that is not a mapping
        ("teams: {alpha: {responses_per_minute: 0}}\n", "teams.alpha.responses_per_minute"),
        ("teams: {'bad name!': {}}\n", "teams"),  # a team name that cannot be a label
        ("keys: [\n", "cannot read YAML"),  # not YAML
        ("extra: 1\n", "extra"),  # a typo at the top level is refused, not ignored
    ],
)
def test_bad_files_say_where(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=fragment):
        load(path)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys.yaml"
    create(path, "alpha", secret=SECRET)
    assert main(["keys", "revoke", "000000000000", "--file", str(path)]) == 2
    assert "no key with id" in capsys.readouterr().err
    # keys hashed with one secret cannot be mixed with another's in one file
    assert main(["keys", "create", "--team", "beta", "--file", str(path)]) == 2
    assert "another GATEWAY_KEY_SECRET" in capsys.readouterr().err


def test_malformed_keys_never_match(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    key, _ = create(path, "alpha", secret=SECRET)
    index = KeyIndex(load(path), SECRET)
    for bad in ("", "arb_", key[:-1], key + "0", key.upper(), "Bearer " + key):
        assert index.verify(bad) is None, bad


def test_up_with_keys_turns_auth_on_and_says_so(tmp_path: Path, gsm8k_dir: Path) -> None:
    from tests.arbiter.test_stack import _up_argv

    path = tmp_path / "keys.yaml"
    key, _ = create(path, "local", secret=SECRET)
    env = {**os.environ, "GATEWAY_KEY_SECRET": SECRET, "ARBITER_API_KEY": key}
    argv, _ = _up_argv(tmp_path, gsm8k_dir, "--once", "--no-embedding", "--keys", str(path))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "auth       on" in done.stdout and str(path) in done.stdout
    assert "math_accuracy=1.000" in done.stdout  # the samples were scored with the key
    log = (tmp_path / "logs" / "gateway.log").read_text()
    assert "auth=on" in log and key.rsplit("_", 1)[1] not in log
    # without --keys: no auth, and the banner says that too
    argv, _ = _up_argv(tmp_path, gsm8k_dir, "--once", "--no-embedding", "--samples", "0")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "auth       off" in done.stdout, done.stdout + done.stderr
