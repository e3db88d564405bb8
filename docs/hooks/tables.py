"""MkDocs hook: reference tables generated from the code at build time.

A page writes a marker on a line of its own and the build replaces it with a table, so
the docs cannot drift from the code:

- ``<!-- settings: gateway -->`` (also ``verify``, ``embedding``, ``judge``): the service's
  pydantic-settings class (found as ``arbiter serve`` finds it): environment variable
  (``env_prefix`` + field name, or the field's alias), type, default, description.
- ``<!-- settings: trainer -->``: the ``TrainerConfig`` dataclass of
  ``arbiter.trainer.config``, as ``python -m arbiter.trainer --help-config`` prints it.
- ``<!-- components -->``: the gateway's component registry (service, endpoint, whether
  it is scored per response or per group); ``<!-- params: math_accuracy -->`` (any
  component): the proto params model the gateway validates that component's params with.
- ``<!-- error-kinds -->``: every ``ErrorKind`` of ``arbiter.proto.errors``, whether it is
  retryable (``RETRYABLE_KINDS``) and the comment written beside it;
  ``<!-- error-types -->``: the same for the envelope's ``ErrorType``.
- ``<!-- error-codes -->``: every ``code`` the code raises (each ``code="..."`` given to an
  error in ``arbiter/``, ``services/``, ``proto/``, and the validation codes of
  ``services.common.app.CODES``), with the status of the error class it is raised with and
  where.
- ``<!-- limits -->``: every limit checked before any work: the contract's bounds
  (``arbiter.proto.limits``, the wire models' field bounds) and each service's limit
  settings with their defaults, and the answer past each.

An unknown marker fails the build (the hook raises), so a typo cannot ship an empty page.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

# The services `arbiter serve` knows, and how it finds each one's settings class.
from arbiter.serve import SERVICES, settings_class

# A marker is a line of its own (one quoted inside `code` in the prose is left alone).
MARKER = re.compile(
    r"^[ \t]*<!--\s*(settings|params|components|error-kinds|error-types|error-codes|limits)"
    r"(?::\s*([a-z_]+))?\s*-->"
    r"[ \t]*$",
    re.MULTILINE,
)
LONG_DEFAULT = 60  # characters; a longer default (a built-in prompt) is summarised


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (no raw HTML, no column breaks)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|").replace("\n", " ")


def _dataclass_type(text: str) -> str:
    """A dataclass field's type as written (a string under postponed annotations)."""
    literal = re.fullmatch(r"Literal\[(.*)\]", text)
    if literal:
        return " \\| ".join(f"`{v.strip().strip(chr(39))}`" for v in literal.group(1).split(","))
    return _cell(text)


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        name = " \\| ".join(_type_name(a) for a in args)
        return f"{name} (optional)" if len(args) < len(get_args(annotation)) else name
    if origin in (dict, list):
        return f"{origin.__name__} (JSON)"
    if annotation.__name__ == "SecretStr":
        return "str (secret)"
    return str(annotation.__name__)


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str) and len(value) > LONG_DEFAULT:
        return f"built in ({len(value):,} characters)"
    return f"`{json.dumps(value)}`"  # a code span: shown as is


def _field_default(info: Any) -> str:
    if info.is_required():  # no default: the caller must give it (python_grader's source)
        return "required"
    if info.default_factory is None:
        return _default(info.default)
    made = info.default_factory()
    # Containers are fixed values; anything else (CPU count, an installed model's path)
    # depends on the machine, and the description says how it is chosen.
    return _default(made) if isinstance(made, dict | list) else "computed at start"


def _bounds(info: Any) -> str:
    """A field's constraints (ge/le/gt/lt, lengths, pattern) as a short text."""
    words = []
    for m in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                words.append(f"{sign} {getattr(m, attr)}")
        if getattr(m, "min_length", None) is not None:
            words.append(f"length ≥ {m.min_length}")
        if getattr(m, "max_length", None) is not None:
            words.append(f"length ≤ {m.max_length:,}")
        if getattr(m, "pattern", None):
            words.append(f"`{m.pattern}`")
    return ", ".join(words)


def _env_name(prefix: str, field_name: str, info: Any) -> str:
    alias = info.validation_alias
    if isinstance(alias, str):
        return alias.upper()
    choices = getattr(alias, "choices", None)
    if choices and isinstance(choices[0], str):
        return str(choices[0]).upper()
    return f"{prefix}{field_name}".upper()


def service_table(name: str) -> str:
    cls = settings_class(name)
    prefix = str(cls.model_config.get("env_prefix", ""))
    rows = [
        "| environment variable | type | default | description |",
        "| --- | --- | --- | --- |",
    ]
    for field_name, info in cls.model_fields.items():
        rows.append(
            f"| `{_env_name(prefix, field_name, info)}` | {_type_name(info.annotation)} "
            f"| {_field_default(info)} | {_cell(info.description or '')} |"
        )
    return "\n".join(rows)


def trainer_table() -> str:
    config = importlib.import_module("arbiter.trainer.config")
    checkout = importlib.import_module("arbiter.gsm8k").checkout()
    here = str(checkout.parent) if checkout else "\0"  # the folder the checkout sits in
    rows = ["| setting | type | default | description |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(config.TrainerConfig):
        value = f.default
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        if isinstance(value, str) and value.startswith(here):
            value = ".." + value[len(here) :]  # beside the checkout, not this machine's path
        rows.append(
            f"| `{f.name}` | {_dataclass_type(str(f.type))} | {_default(value)} "
            f"| {_cell(f.metadata.get('help', ''))} |"
        )
    return "\n".join(rows)


def _components() -> dict[str, Any]:
    return dict(importlib.import_module("arbiter.services.scoring.recipes").COMPONENTS)


def components_table() -> str:
    rows = [
        "| component | service | endpoint | scored per | params model |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in _components().values():
        model = spec.params_model
        rows.append(
            f"| `{spec.name}` | {spec.service} | `POST {spec.path}` | {spec.granularity} "
            f"| `{model.__module__}.{model.__name__}` |"
        )
    return "\n".join(rows)


def params_table(component: str) -> str:
    components = _components()
    if component not in components:
        raise ValueError(f"params marker names unknown component {component!r}")
    fields = components[component].params_model.model_fields
    if not fields:
        return f"`{component}` takes no params."
    rows = ["| param | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
    for name, info in fields.items():
        rows.append(
            f"| `{name}` | {_type_name(info.annotation)} | {_field_default(info)} "
            f"| {_cell(_bounds(info))} | {_cell(info.description or '')} |"
        )
    return "\n".join(rows)


def _literal_table(name: str, header: str, retryable: bool) -> str:
    """Every value of ``name = Literal[...]`` in arbiter.proto.errors, with its comment."""
    module = importlib.import_module("arbiter.proto.errors")
    source = inspect.getsource(module)
    block = source[source.index(f"{name} = Literal[") :]
    block = block[: block.index("\n]")]
    comments = dict(re.findall(r'"([a-z_]+)",\s*#\s*(.*)', block))
    again = getattr(module, "RETRYABLE_KINDS", frozenset())
    rows = [f"| {header} | retryable | meaning |" if retryable else f"| {header} | meaning |"]
    rows.append("| --- | --- | --- |" if retryable else "| --- | --- |")
    for value in get_args(getattr(module, name)):
        mid = f" {'yes' if value in again else 'no'} |" if retryable else ""
        rows.append(f"| `{value}` |{mid} {_cell(comments.get(value, ''))} |")
    return "\n".join(rows)


def error_codes() -> dict[str, dict[str, set[str]]]:
    """code -> {"status": statuses, "where": modules}: every literal ``code=`` keyword of a
    call in the package's source (an f-string's fields shown as ``<...>``), and the values of
    ``services.common.app.CODES`` (pydantic's error types as codes, 422)."""
    import ast

    import arbiter
    import arbiter.errors as errors
    from arbiter.services.common.app import CODES

    repo = Path(__file__).resolve().parents[2]
    roots = [Path(arbiter.__file__).parent, repo / "services", repo / "proto"]
    found: dict[str, dict[str, set[str]]] = {}

    def add(code: str, status: str, where: str) -> None:
        entry = found.setdefault(code, {"status": set(), "where": set()})
        entry["status"].add(status)
        entry["where"].add(where)

    for root in roots:
        for path in sorted(root.rglob("*.py")):
            where = path.relative_to(repo).with_suffix("").as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                cls = getattr(
                    errors, getattr(node.func, "id", getattr(node.func, "attr", "")), None
                )
                status = str(getattr(cls, "status", "")) if isinstance(cls, type) else ""
                for kw in node.keywords:  # an explicit status wins (a 408 raised as a 400)
                    if kw.arg == "status" and isinstance(kw.value, ast.Constant):
                        status = str(kw.value.value)
                for kw in node.keywords:
                    if kw.arg != "code":
                        continue
                    if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        add(kw.value.value, status, where)
                    elif isinstance(kw.value, ast.JoinedStr):
                        text = "".join(
                            str(v.value)
                            if isinstance(v, ast.Constant)
                            else f"<{ast.unparse(v).split('.')[-1].strip('{}')}>"
                            for v in kw.value.values
                        )
                        add(text, status, where)
    for code in CODES.values():
        add(code, "422", "services/common/app")
    return found


def error_codes_table() -> str:
    rows = ["| `code` | status | raised in |", "| --- | --- | --- |"]
    for code, entry in sorted(error_codes().items()):
        status = ", ".join(sorted(s for s in entry["status"] if s)) or "(its error's)"
        where = ", ".join(f"`{w}`" for w in sorted(entry["where"]))
        rows.append(f"| `{code}` | {status} | {where} |")
    return "\n".join(rows)


def _setting(service: str, name: str) -> str:
    """``VAR`` (default) of one service setting, as a table cell."""
    cls = settings_class(service)
    info = cls.model_fields[name]
    prefix = str(cls.model_config.get("env_prefix", ""))
    return f"`{_env_name(prefix, name, info)}` ({info.default:,})"


def limits_table() -> str:
    """The one table of limits: read from the code, so it cannot drift from it."""
    limits = importlib.import_module("arbiter.proto.limits")
    gateway = importlib.import_module("arbiter.proto.gateway")
    embedding = importlib.import_module("arbiter.proto.embedding")
    components = gateway.Recipe.model_fields["components"].metadata
    max_components = next(m.max_length for m in components if hasattr(m, "max_length"))
    per_service = " / ".join(("gateway", "verify", "embedding", "judge", "sandbox"))
    sandbox = importlib.import_module("arbiter.proto.sandbox")
    body = "<br>".join(_setting(s, "max_body_bytes") for s in per_service.split(" / "))
    chars = "<br>".join(_setting(s, "max_total_chars") for s in per_service.split(" / "))
    held = "<br>".join(_setting(s, "max_buffered_bytes") for s in per_service.split(" / "))
    rows = [
        "| what | where | limit | past it |",
        "| --- | --- | --- | --- |",
        f"| request body, bytes (counted while read; `Content-Length` checked first) "
        f"| every service | {body} | 413 `body_too_large` |",
        f"| bodies of all requests in progress, bytes together | every service | {held} "
        f"| 429 `too_busy` (retryable, `Retry-After: 1`) |",
        f"| characters of all texts of one request | every service | {chars} "
        f"| 422 `too_many_chars`, `param` names the text where the total crossed |",
        f"| characters per prompt, reference or response | every service | "
        f"{limits.MAX_TEXT_CHARS:,} | 422 `text_too_long` naming e.g. `groups.3.responses.7` |",
        f"| responses per group | every service | {limits.MAX_RESPONSES:,} "
        f"| 422 `list_too_long` naming `groups.N.responses` |",
        f"| groups per request | every service | {limits.MAX_GROUPS:,} "
        f"| 422 `list_too_long` naming `groups` |",
        "| group `id` | every service | 256 characters | 422 `text_too_long` |",
        "| strings | every service | valid Unicode (no lone surrogate such as `\\ud800`) "
        "| 422 `invalid_unicode` naming the field |",
        f"| free-form JSON (recipe params, compat payloads) | gateway "
        f"| nested ≤ {limits.MAX_JSON_DEPTH} levels | 422 `too_deep` |",
        "| the body itself | every service | JSON, UTF-8, nesting the parser can read "
        "| 400 `invalid_json` |",
        "| `Content-Type` | every service | `application/json` (or `+json`); absent is read "
        "as JSON | 415 `unsupported_media_type` |",
        f"| components per recipe | gateway | {max_components} (each once) "
        f"| 422 naming `recipe.components` |",
        f"| recipe weights | gateway | finite, \\|weight\\| ≤ {limits.MAX_WEIGHT:g} "
        f"| 422 naming `recipe.components.N.weight` |",
        f"| responses per request, all groups | verify | {_setting('verify', 'max_items')} "
        f"| 413 `too_many_items` |",
        f"| texts per request | embedding | {_setting('embedding', 'max_inputs')}; "
        f"`/v1/embeddings` at most {embedding.MAX_EMBEDDING_INPUTS:,} on the wire "
        f"| 413 `too_many_items` naming `input` or `groups` |",
        f"| queued texts in the service | embedding "
        f"| {_setting('embedding', 'max_queued_texts')} | 429 (retryable) |",
        f"| requests in flight to the model server | judge "
        f"| {_setting('judge', 'max_concurrency')} | queued, within each item's deadline |",
        f"| calls in flight per component service | gateway "
        f"| {_setting('gateway', 'max_concurrency')} | queued, within the component's deadline |",
        f"| responses per request, all groups | sandbox | {_setting('sandbox', 'max_items')} "
        f"| 413 `too_many_items` |",
        f"| tests per reference | sandbox | {_setting('sandbox', 'max_tests')} "
        f"| `null`, kind `invalid_reference` |",
        f"| `python_grader` source | gateway, sandbox "
        f"| {sandbox.MAX_GRADER_SOURCE_CHARS:,} characters; must compile and define `grade` "
        f"| 422 naming `recipe.components.N.params.source` |",
        "| programs running at once | sandbox | `SANDBOX_WORKERS` (CPU count) "
        f"| queued, up to {_setting('sandbox', 'queue_timeout_s')} s, then `null` `timeout` |",
        "| a program's time, memory, processes, output | sandbox | per test and per response "
        "([sandbox](../services/sandbox.md#settings)) | the tests it hit fail with the reason |",
    ]
    return "\n".join(rows)


def _replace(match: re.Match[str]) -> str:
    kind, arg = match.group(1), match.group(2)
    if kind == "limits":
        return limits_table()
    if kind == "error-kinds":
        return _literal_table("ErrorKind", "kind", retryable=True)
    if kind == "error-types":
        return _literal_table("ErrorType", "`type`", retryable=False)
    if kind == "error-codes":
        return error_codes_table()
    if kind == "components":
        return components_table()
    if kind == "params" and arg:
        return params_table(arg)
    if kind == "settings" and arg == "trainer":
        return trainer_table()
    if kind == "settings" and arg in SERVICES:
        return service_table(arg)
    raise ValueError(f"unknown marker {match.group(0)!r}; settings markers: trainer, {SERVICES}")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: replace every marker on the page before it is rendered."""
    return MARKER.sub(_replace, markdown)
