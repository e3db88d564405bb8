"""API keys on a real gateway process: the auth matrix, reload without restart, no key in
logs or metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from arbiter.errors import Unauthorized
from arbiter.keys import KeysFile, load, revoke
from arbiter.services.gateway import auth
from arbiter.services.gateway.auth import KeyStore
from arbiter.services.gateway.settings import GatewaySettings
from tests.conftest import start_service
from tests.services.gateway.teams import (
    SECRET,
    Keys,
    groups,
    post,
    start_gateway,
    usage,
    wait_for,
)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("auth") / "keys.yaml")
    k.add("alpha", "alpha")
    k.add("alpha-old", "alpha")  # revoked in a test
    k.add("beta", "beta", recipes=["gsm8k"])  # may use gsm8k only
    k.add("gamma", "gamma", components=["format"])  # may use the format component only
    k.add("admin", "ops", admin=True)
    return k


@pytest.fixture(scope="module")
def gateway(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[Any]:
    proc, url = start_gateway(log_dir, verify_url, redis_url, keys)
    proc.url = url  # type: ignore[attr-defined]
    yield proc
    proc.stop()


def _body(recipe: Any = "gsm8k") -> dict[str, Any]:
    return {"recipe": recipe, "groups": groups(1, 2)}


def _sample(metrics: str, series: str) -> float:
    """A series' value in a /metrics text; 0 when it is not there yet."""
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err


FORMAT_ONLY = {"components": [{"name": "format"}]}


@pytest.mark.parametrize(
    ("label", "header", "recipe", "status", "code"),
    [
        (None, None, "gsm8k", 401, "missing_api_key"),  # no Authorization header at all
        (None, "Token abc", "gsm8k", 401, "invalid_authorization"),  # neither Bearer nor Basic
        (None, "Basic dXNlcjpwdw==", "gsm8k", 401, "invalid_api_key"),  # Basic user:pw, no key
        (None, "Bearer arb_000000000000_" + "0" * 48, "gsm8k", 401, "invalid_api_key"),  # unknown
        (None, "Bearer not-a-key", "gsm8k", 401, "invalid_api_key"),  # malformed
        (None, "Basic bm90IGJhc2U2NA", "gsm8k", 401, "invalid_authorization"),  # bad base64
        ("alpha", None, "gsm8k", 200, None),  # a team without allow-lists: anything
        ("alpha", None, FORMAT_ONLY, 200, None),  # inline recipes too
        ("beta", None, "gsm8k", 200, None),  # its one allowed recipe
        ("beta", None, "gsm8k-diverse", 403, "recipe_not_allowed"),  # another named recipe
        ("beta", None, FORMAT_ONLY, 403, "recipe_not_allowed"),  # inline is not in its list
        ("gamma", None, FORMAT_ONLY, 200, None),  # only allowed components
        ("gamma", None, "gsm8k", 403, "component_not_allowed"),  # math_accuracy is not
        ("admin", None, "gsm8k", 200, None),  # an admin key scores like any other
    ],
)
def test_auth_matrix(
    gateway: Any,
    keys: Keys,
    label: str | None,
    header: str | None,
    recipe: Any,
    status: int,
    code: str | None,
) -> None:
    headers = keys.headers(label) if label else ({"Authorization": header} if header else {})
    r = post(gateway.url, _body(recipe), headers)
    assert r.status_code == status, r.text
    if code is not None:
        _error(r, status, code)
        assert r.json()["error"]["type"] in ("authentication_error", "permission_error")
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_open_routes_and_every_v1_route_need_a_key(gateway: Any, keys: Keys) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert httpx.get(f"{gateway.url}{path}").status_code == 200, path
    _error(httpx.get(f"{gateway.url}/v1/recipes"), 401, "missing_api_key")
    _error(httpx.get(f"{gateway.url}/v1/usage"), 401, "missing_api_key")
    listed = httpx.get(f"{gateway.url}/v1/recipes", headers=keys.headers("beta"))
    assert [r["name"] for r in listed.json()["recipes"]] == ["gsm8k"]  # only what it may use
    sample = {"prompt": "1+1?", "response": "<answer>2</answer>", "label": "2"}
    slime = "/v1/compat/slime/gsm8k?window_ms=0"
    _error(post(gateway.url, sample, {}, slime), 401, "missing_api_key")
    assert post(gateway.url, sample, keys.headers("beta"), slime).status_code == 200
    denied = post(gateway.url, sample, keys.headers("beta"), slime.replace("gsm8k", "gsm8k-dj"))
    _error(denied, 403, "recipe_not_allowed")


def test_usage_of_other_teams_is_admin_only(gateway: Any, keys: Keys) -> None:
    assert post(gateway.url, _body(), keys.headers("alpha")).status_code == 200
    own = usage(gateway.url, keys.headers("alpha"))
    assert {d["team"] for d in own["days"]} == {"alpha"}
    r = httpx.get(f"{gateway.url}/v1/usage", params={"team": "beta"}, headers=keys.headers("alpha"))
    _error(r, 403, "admin_only")
    every = usage(gateway.url, keys.headers("admin"))
    assert {"alpha", "beta"} <= {d["team"] for d in every["days"]}
    assert {d["team"] for d in usage(gateway.url, keys.headers("admin"), team="beta")["days"]} == {
        "beta"
    }


def test_revoked_and_new_keys_apply_without_restart(gateway: Any, keys: Keys) -> None:
    old = keys.headers("alpha-old")
    assert post(gateway.url, _body(), old).status_code == 200
    revoke(keys.path, keys.ids["alpha-old"])
    assert wait_for(lambda: post(gateway.url, _body(), old).status_code == 401)
    _error(post(gateway.url, _body(), old), 401, "invalid_api_key")
    keys.add("delta", "delta")  # a team and key the gateway has never seen
    assert wait_for(lambda: post(gateway.url, _body(), keys.headers("delta")).status_code == 200)
    assert post(gateway.url, _body(), keys.headers("alpha")).status_code == 200  # others stay


def test_a_bad_keys_file_keeps_the_previous_keys(gateway: Any, keys: Keys) -> None:
    good = keys.path.read_text()
    try:
        keys.path.write_text("keys: [this is not a key record]\n")
        # one reload period and more: the broken file is logged and ignored
        wait_for(lambda: False, timeout=0.6)
        assert post(gateway.url, _body(), keys.headers("alpha")).status_code == 200
    finally:
        keys.path.write_text(good)


def test_a_key_works_as_soon_as_it_is_written(tmp_path: Path) -> None:
    # issue 47: a key added to the file was refused for up to a reload period (a fresh-clone
    # CI run got 401 for a key its test had just added); an unknown key re-checks the file
    keys = Keys(tmp_path / "keys.yaml")
    keys.add("alpha", "alpha")
    store = KeyStore(keys.path, SECRET, reload_s=3600)  # no periodic reload in this test
    new = keys.add("delta", "delta")
    assert store.verify(f"Bearer {new}").team == "delta"


def test_unknown_keys_load_each_version_of_the_file_at_most_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys(tmp_path / "keys.yaml")
    keys.add("alpha", "alpha")
    store = KeyStore(keys.path, SECRET, reload_s=3600)
    loads: list[Path] = []

    def counted(path: Path) -> KeysFile:
        loads.append(path)
        return load(path)

    monkeypatch.setattr(auth, "load", counted)
    unknown = "Bearer arb_000000000000_" + "0" * 48
    for _ in range(100):  # the file unchanged: a stat each, no load
        with pytest.raises(Unauthorized):
            store.verify(unknown)
    assert loads == []
    keys.path.write_text("keys: [this is not a key record]\n")
    for _ in range(100):  # a broken version: loaded once, the previous keys stay
        with pytest.raises(Unauthorized):
            store.verify(unknown)
    assert len(loads) == 1
    assert store.verify(f"Bearer {keys.keys['alpha']}").team == "alpha"


def test_team_label_on_metrics_and_no_key_anywhere(gateway: Any, keys: Keys) -> None:
    assert post(gateway.url, _body(), keys.headers("alpha")).status_code == 200
    post(gateway.url, _body(), {"Authorization": f"Bearer {keys.keys['alpha']}x"})  # a 401
    # An open /metrics names no team (it once showed every team's counts); an admin
    # key (Prometheus scrapes with one) sees the per-team series.
    public = httpx.get(f"{gateway.url}/metrics").text
    assert "arbiter_gateway_requests" in public or "arbiter_http_request_seconds" in public
    assert "team=" not in public
    as_alpha = httpx.get(f"{gateway.url}/metrics", headers=keys.headers("alpha")).text
    assert "team=" not in as_alpha  # a team's key is not enough
    metrics = httpx.get(f"{gateway.url}/metrics", headers=keys.headers("admin")).text
    assert 'arbiter_gateway_team_requests_total{route="/v1/score",status="200",team="alpha"}' in (
        metrics
    )
    assert 'team="unauthenticated"' in metrics
    # A null counts against its team (the dashboard's null rate by team): no reference here.
    nulls = 'arbiter_gateway_team_nulls_total{kind="invalid_reference",team="alpha"}'
    before = _sample(metrics, nulls)
    group = {"id": "n", "prompt": "1+1?", "responses": ["<answer>2</answer>"]}
    answer = post(gateway.url, {"recipe": "gsm8k", "groups": [group]}, keys.headers("alpha"))
    assert answer.status_code == 200 and answer.json()["groups"][0]["masked"] == [True]
    metrics = httpx.get(f"{gateway.url}/metrics", headers=keys.headers("admin")).text
    assert _sample(metrics, nulls) == before + 1
    log_text = Path(gateway.log_path).read_text()
    for key in keys.keys.values():
        secret = key.rsplit("_", 1)[1]
        assert secret not in metrics
        assert secret not in log_text, "a key reached the gateway's log"
        assert key not in keys.path.read_text()  # the file holds hashes only


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        # production with the development secret
        ({"environment": "production"}, "GATEWAY_KEY_SECRET"),
        # production with a short secret
        ({"environment": "production", "key_secret": "short"}, "32 characters"),
    ],
)
def test_settings_refuse_an_unsafe_secret_outside_development(
    env: dict[str, str], fragment: str, tmp_path: Path
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("keys: []\n")
    on = {"keys_file": path, "redis_url": "redis://127.0.0.1:1/0"}
    with pytest.raises(ValidationError, match=fragment):
        GatewaySettings(**env, **on)  # type: ignore[arg-type]
    # Auth off (no keys file): the secret is never used, so there is nothing to refuse.
    assert GatewaySettings(**env).keys_file is None  # type: ignore[arg-type]


def test_auth_off_in_production_starts_scores_and_says_so(
    log_dir: Path, verify_url: str, redis_url: str, gateway: Any
) -> None:
    # docker compose's first run: production, Redis, no keys file, no secret.
    proc, url = start_service(
        "gateway",
        log_dir,
        {
            "GATEWAY_VERIFY_URL": verify_url,
            "REDIS_URL": redis_url,
            "GATEWAY_ENVIRONMENT": "production",
        },
    )
    try:
        r = httpx.post(f"{url}/v1/score", json=_body(), timeout=30)
        assert r.status_code == 200, r.text
        assert proc.log_path is not None
        assert "AUTH IS OFF" in proc.log_path.read_text()
    finally:
        proc.stop()
    assert "AUTH IS OFF" not in Path(gateway.log_path).read_text()  # auth on: no banner


def test_settings_need_redis_with_a_keys_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("keys: []\n")
    with pytest.raises(ValidationError, match="needs REDIS_URL"):
        GatewaySettings(keys_file=path, redis_url=None)
    assert GatewaySettings(keys_file=path, redis_url="redis://127.0.0.1:1/0").keys_file == path


def test_frameworks_without_headers_authenticate_with_the_key_in_the_url(
    gateway: Any, keys: Keys
) -> None:
    # slime's and OpenRLHF's remote-reward clients post with aiohttp and no headers of their
    # own; aiohttp sends a URL's userinfo as HTTP Basic, whose password is the key.
    from tests.services.gateway.test_compat_slime import remote_rm

    base = gateway.url.replace("http://", f"http://alpha:{keys.keys['alpha']}@")
    url = f"{base}/v1/compat/slime/gsm8k?window_ms=0"
    status, body = asyncio.run(remote_rm(url, "1+1?", "<answer>2</answer>", "2"))
    assert status == 200, body
    wrong = gateway.url.replace("http://", f"http://alpha:{keys.keys['alpha']}x@")
    status, body = asyncio.run(remote_rm(f"{wrong}/v1/compat/slime/gsm8k", "1+1?", "2", "2"))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    basic = httpx.BasicAuth("anyone", keys.keys["beta"])
    r = httpx.post(f"{gateway.url}/v1/score", json=_body(), auth=basic)
    assert r.status_code == 200, r.text
    assert keys.keys["alpha"].rsplit("_", 1)[1] not in Path(gateway.log_path).read_text()
