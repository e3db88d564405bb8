"""API keys and teams: the keys file that ``arbiter keys`` writes and the gateway reads.

A key is ``arb_<id>_<secret>`` (``id``: 12 hex digits, ``secret``: 48). It is shown once, by
``arbiter keys create``; the file keeps only ``hmac-sha256(GATEWAY_KEY_SECRET, key)``, so a
leaked keys file gives no usable key, and the gateway finds the record by the id and
compares the hash in constant time (``hmac.compare_digest``). ``secret_check`` in the file
is an HMAC of a fixed text with the same secret: a gateway started with another secret
says so instead of answering 401 to every key.

The file (YAML; ``arbiter keys`` writes it, a person may edit ``teams:`` by hand)::

    version: 1
    secret_check: hmac-sha256:…
    teams:
      team-a:
        responses_per_minute: 6000      # null (or absent): no limit
        judge_tokens_per_day: 2000000   # null: no limit
        recipes: [gsm8k, gsm8k-dj]      # null: every recipe (named or inline)
        components: null                # null: every component
    keys:
      - {id: 3f9c2a1b7d4e, team: team-a, admin: false, hash: "hmac-sha256:…",
         created: "2026-11-26T09:30:00Z", revoked: null, name: "trainer"}

Needs the standard library, pydantic and PyYAML only (no service extras).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import re
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

# The secret `arbiter keys` and the gateway use when GATEWAY_KEY_SECRET is unset; the gateway
# refuses it outside development (GATEWAY_ENVIRONMENT).
DEV_SECRET = "arbiter-development-secret-do-not-use"
SECRET_ENV = "GATEWAY_KEY_SECRET"
KEYS_FILE_ENV = "GATEWAY_KEYS_FILE"
ANONYMOUS = "anonymous"  # the team of every caller when auth is off

TeamName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
_KEY = re.compile(r"^arb_([0-9a-f]{12})_([0-9a-f]{48})$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Team(_Model):
    """One team's limits and allow-lists (``null``: no limit, every recipe/component)."""

    responses_per_minute: int | None = Field(default=None, ge=1)
    judge_tokens_per_day: int | None = Field(default=None, ge=1)
    recipes: list[str] | None = None
    components: list[str] | None = None


class KeyRecord(_Model):
    id: str = Field(pattern=r"^[0-9a-f]{12}$")
    team: TeamName
    admin: bool = False
    hash: str
    created: str
    revoked: str | None = None
    name: str | None = None


class KeysFile(_Model):
    version: int = 1
    secret_check: str | None = None
    teams: dict[TeamName, Team] = Field(default_factory=dict)
    keys: list[KeyRecord] = Field(default_factory=list)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's team (never the key itself) and what the team may do."""

    team: str
    key_id: str | None  # None when auth is off
    admin: bool
    limits: Team

    def may_use_recipe(self, name: str) -> bool:
        allowed = self.limits.recipes
        return allowed is None or name in allowed

    def may_use_component(self, name: str) -> bool:
        allowed = self.limits.components
        return allowed is None or name in allowed


OPEN = Principal(team=ANONYMOUS, key_id=None, admin=True, limits=Team())


def secret_from_env() -> str:
    return os.environ.get(SECRET_ENV) or DEV_SECRET


def hash_key(secret: str, key: str) -> str:
    digest = hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()
    return f"hmac-sha256:{digest}"


def secret_check(secret: str) -> str:
    return hash_key(secret, "arbiter keys file")


def key_id(key: str) -> str | None:
    """The id inside a well-formed key, else None."""
    m = _KEY.match(key)
    return m.group(1) if m else None


def load(path: Path) -> KeysFile:
    """The keys file at ``path`` (an absent file is an empty one); ValueError says what is
    wrong and where."""
    if not path.exists():
        return KeysFile()
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        return KeysFile.model_validate(doc)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"keys file {path}: cannot read YAML: {exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"keys file {path}: {where}: {err['msg']}") from None


def save(path: Path, doc: KeysFile) -> None:
    """Write atomically (a reader sees the old file or the new one). The file holds no key,
    only keyed hashes, so it is readable by others (a gateway container's own user): 0644,
    or the mode the file already had."""
    text = "# Arbiter API keys (written by `arbiter keys`): hashes only, never a key.\n"
    text += yaml.safe_dump(doc.model_dump(), sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def create(
    path: Path,
    team: str,
    *,
    secret: str,
    admin: bool = False,
    name: str | None = None,
    limits: dict[str, object] | None = None,
) -> tuple[str, KeyRecord]:
    """Add a key for ``team`` (created if new; ``limits`` set given Team fields) and return
    (the key, its record). The key itself is not stored."""
    doc = load(path)
    check = secret_check(secret)
    if doc.secret_check is not None and doc.secret_check != check:
        raise ValueError(
            f"keys file {path} was written with another {SECRET_ENV}; set the same one "
            "(the gateway's) before adding keys"
        )
    doc.secret_check = check
    current = doc.teams.get(team, Team()).model_dump()
    current.update({k: v for k, v in (limits or {}).items() if v is not None})
    doc.teams[team] = Team.model_validate(current)
    ident = secrets.token_hex(6)
    key = f"arb_{ident}_{secrets.token_hex(24)}"
    record = KeyRecord(
        id=ident, team=team, admin=admin, hash=hash_key(secret, key), created=_now(), name=name
    )
    doc.keys.append(record)
    save(path, doc)
    return key, record


def revoke(path: Path, ident: str) -> KeyRecord:
    doc = load(path)
    for record in doc.keys:
        if record.id == ident:
            if record.revoked is None:
                record.revoked = _now()
                save(path, doc)
            return record
    raise ValueError(f"keys file {path}: no key with id {ident!r} (`arbiter keys list` shows ids)")


class KeyIndex:
    """The gateway's view of one version of the keys file: key -> Principal."""

    def __init__(self, doc: KeysFile, secret: str):
        self.secret = secret
        self._by_id = {r.id: r for r in doc.keys if r.revoked is None}
        self.teams = doc.teams
        self._principals = {
            r.id: Principal(r.team, r.id, r.admin, doc.teams.get(r.team, Team()))
            for r in self._by_id.values()
        }

    def verify(self, key: str) -> Principal | None:
        """The key's principal, or None for a malformed, unknown or revoked key."""
        ident = key_id(key)
        record = self._by_id.get(ident) if ident else None
        if record is None or ident is None:
            return None
        if not hmac.compare_digest(hash_key(self.secret, key), record.hash):
            return None
        return self._principals[ident]


# --- `arbiter keys create|list|revoke` ---------------------------------------------------


def _default_file() -> Path:
    return Path(os.environ.get(KEYS_FILE_ENV) or "keys.yaml")


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _cmd_create(args: argparse.Namespace) -> int:
    secret = secret_from_env()
    limits = {
        "responses_per_minute": args.responses_per_minute,
        "judge_tokens_per_day": args.judge_tokens_per_day,
        "recipes": _names(args.recipes),
        "components": _names(args.components),
    }
    key, record = create(
        args.file, args.team, secret=secret, admin=args.admin, name=args.name, limits=limits
    )
    print(key)  # stdout: the key alone, so `KEY=$(arbiter keys create …)` works
    role = "admin key" if record.admin else "key"
    print(f"{role} {record.id} for team {record.team} added to {args.file}; "
          "the key above is shown only now", file=sys.stderr)  # fmt: skip
    if secret == DEV_SECRET:
        print(f"warning: {SECRET_ENV} is unset, so the key is hashed with the development "
              "secret; a gateway outside development refuses it", file=sys.stderr)  # fmt: skip
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    doc = load(args.file)
    print(f"{'id':<13} {'team':<20} {'admin':<5} {'created':<21} {'revoked':<21} name")
    for r in doc.keys:
        print(f"{r.id:<13} {r.team:<20} {'yes' if r.admin else 'no':<5} {r.created:<21} "
              f"{r.revoked or '-':<21} {r.name or ''}")  # fmt: skip
    for name, team in doc.teams.items():
        print(f"team {name}: " + ", ".join(f"{k}={v}" for k, v in team.model_dump().items()))
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    record = revoke(args.file, args.id)
    print(f"key {record.id} of team {record.team} revoked at {record.revoked}")
    return 0


def _guarded(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except ValueError as exc:  # a bad file, an unknown id, another secret
            print(f"arbiter keys: {exc}", file=sys.stderr)
            return 2

    return run


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="create, list and revoke API keys (the gateway's keys file)")
    keys = p.add_subparsers(dest="keys_command", required=True)
    file_help = f"the keys file (default ${KEYS_FILE_ENV}, else keys.yaml)"

    c = keys.add_parser("create", help="add a key for a team; prints the key once")
    c.add_argument("--team", required=True, help="the team the key belongs to")
    c.add_argument("--admin", action="store_true", help="may read every team's usage")
    c.add_argument("--name", default=None, help="a label for the key (e.g. the job using it)")
    c.add_argument("--responses-per-minute", type=int, default=None, help="set the team's quota")
    c.add_argument("--judge-tokens-per-day", type=int, default=None, help="set the team's quota")
    c.add_argument("--recipes", default=None, help="the team's allowed recipes, comma-separated")
    c.add_argument("--components", default=None, help="its allowed components, comma-separated")
    c.set_defaults(func=_guarded(_cmd_create))

    ls = keys.add_parser("list", help="every key (id, team, admin, created, revoked) and team")
    ls.set_defaults(func=_guarded(_cmd_list))

    r = keys.add_parser(
        "revoke", help="revoke a key by its id (gateways drop it within GATEWAY_KEYS_RELOAD_S)"
    )
    r.add_argument("id", help="the key's id (`arbiter keys list`)")
    r.set_defaults(func=_guarded(_cmd_revoke))
    for q in (c, ls, r):
        q.add_argument("--file", type=Path, default=_default_file(), help=file_help)
