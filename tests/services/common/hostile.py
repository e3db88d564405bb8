"""Hostile bodies every service must answer in the envelope, naming the field, briefly.

Shared by each service's tests (``check_hostile_bodies(url, path, body)``): a lone
surrogate in an object KEY (a 500, ``PydanticSerializationError``, on every service before:
the path naming the key held it, and the envelope could not be encoded; in values it was
already a 422) and a megabyte-long key (echoed whole in a megabyte 422 before).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from arbiter.proto.errors import ErrorResponse

MB = 1 << 20
MAX_ERROR_BYTES = 4096  # an error answer stays this small whatever the input


def hostile_bodies(body: dict[str, Any], nested: str | None) -> list[tuple[str, bytes, str, str]]:
    """(why, raw body, code, param) built on a valid ``body``; ``nested`` names one of its
    object fields (a dict) to hide a key in, if it has one."""
    cases = [
        # a lone high surrogate as a key of the top object
        ("surrogate key, top", _raw({**body, "\ud800": 1}), "invalid_unicode", "\\ud800"),
        # a surrogate key after a valid surrogate pair (one character): only the lone one
        # is escaped in the name
        ("surrogate key beside a pair", _raw({**body, "\ud83d\ude00\ud800": 1}),
         "invalid_unicode", "\U0001f600\\ud800"),
    ]  # fmt: skip
    if nested is not None:
        # a lone low surrogate as a key one level down: the path names it, escaped
        inner = _raw({**body, nested: {**body[nested], "\udfff": 1}})
        cases.append(("surrogate key, nested", inner, "invalid_unicode", f"{nested}.\\udfff"))
    return cases


def _raw(value: Any) -> bytes:
    return json.dumps(value).encode()  # ensure_ascii: lone surrogates spelled \udXXX


def check_hostile_bodies(
    url: str, path: str, body: dict[str, Any], nested: str | None, long_key: bool = True
) -> None:
    """Every hostile body gets a 422 in the envelope naming the field, and (``long_key``:
    the model refuses unknown fields) a megabyte-long unknown key comes back cut short."""
    with httpx.Client(base_url=url, timeout=60) as client:
        ok = client.post(path, json=body)
        assert ok.status_code < 500, ok.text  # the base body is not itself the problem
        for why, raw, code, param in hostile_bodies(body, nested):
            r = client.post(path, content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 422, (why, r.status_code, r.text[:300])
            err = ErrorResponse.model_validate_json(r.content).error
            assert (err.code, err.param) == (code, param), (why, err)
        if not long_key:
            return
        r = client.post(path, json={**body, "k" * MB: 1})
        assert r.status_code == 422, r.text[:300]
        assert len(r.content) < MAX_ERROR_BYTES, len(r.content)
        err = ErrorResponse.model_validate_json(r.content).error
        assert err.param is not None and err.param.startswith("kkk")
        assert f"({MB} characters)" in err.param
