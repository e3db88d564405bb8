"""MkDocs hook: settings tables generated from the settings classes at build time.

A page writes a marker on a line of its own and the build replaces it with a table, so
the docs cannot drift from the code:

- ``<!-- settings: gateway -->`` (also ``verify``, ``embedding``, ``judge``): the
  pydantic-settings class in ``arbiter.services.<name>.settings``: environment variable
  (``env_prefix`` + field name, or the field's alias), type, default, description.
- ``<!-- settings: trainer -->``: the ``TrainerConfig`` dataclass of
  ``arbiter.trainer.config``, as ``python -m arbiter.trainer --help-config`` prints it.
- ``<!-- error-kinds -->``: every value of the wire contract's ``ErrorKind``, whether it
  is retryable (``RETRYABLE_KINDS``) and the comment written beside it in ``proto``;
  ``<!-- error-types -->``: the same for the envelope's ``ErrorType``.

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
    r"^[ \t]*<!--\s*(settings:\s*([a-z_]+)|error-kinds|error-types)\s*-->[ \t]*$", re.MULTILINE
)
# Where the wire's failure vocabulary (ErrorKind, ErrorType, RETRYABLE_KINDS) may live.
ERROR_MODULES = ("arbiter.proto.errors", "arbiter.proto.components")


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
    return f"`{json.dumps(value)}`"  # a code span: shown as is


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
        if info.default_factory is not None:
            made = info.default_factory()  # type: ignore[call-arg]
            # Containers are fixed values; anything else (CPU count, an installed model's
            # path) depends on the machine, and the description says how it is chosen.
            default = _default(made) if isinstance(made, dict | list) else "computed at start"
        else:
            default = _default(info.default)
        rows.append(
            f"| `{_env_name(prefix, field_name, info)}` | {_type_name(info.annotation)} "
            f"| {default} | {_cell(info.description or '')} |"
        )
    return "\n".join(rows)


def trainer_table() -> str:
    config = importlib.import_module("arbiter.trainer.config")
    here = str(Path(config.__file__).resolve().parents[2])  # the checkout's parent folder
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


def _errors_module() -> Any:
    for name in ERROR_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if "ErrorKind" in vars(module):
            return module
    raise ValueError(f"no ErrorKind Literal in {ERROR_MODULES}")


def _literal_comments(module: Any, name: str) -> dict[str, str]:
    """The comment written beside each value of ``name = Literal[...]`` in ``module``."""
    source = inspect.getsource(module)
    block = source[source.index(f"{name} = Literal[") :]
    block = block[: block.index("\n]")]
    return dict(re.findall(r'"([a-z_]+)",\s*#\s*(.*)', block))


def error_kinds_table() -> str:
    module = _errors_module()
    comments = _literal_comments(module, "ErrorKind")
    retryable = getattr(module, "RETRYABLE_KINDS", None)
    rows = ["| kind | retryable | meaning |", "| --- | --- | --- |"]
    for kind in get_args(module.ErrorKind):
        again = "?" if retryable is None else ("yes" if kind in retryable else "no")
        rows.append(f"| `{kind}` | {again} | {_cell(comments.get(kind, ''))} |")
    return "\n".join(rows)


def error_types_table() -> str:
    module = _errors_module()
    comments = _literal_comments(module, "ErrorType")
    rows = ["| `type` | status and meaning |", "| --- | --- |"]
    for kind in get_args(module.ErrorType):
        rows.append(f"| `{kind}` | {_cell(comments.get(kind, ''))} |")
    return "\n".join(rows)


def _replace(match: re.Match[str]) -> str:
    if match.group(1) == "error-kinds":
        return error_kinds_table()
    if match.group(1) == "error-types":
        return error_types_table()
    name = match.group(2)
    if name == "trainer":
        return trainer_table()
    if name in SERVICES:
        return service_table(name)
    raise ValueError(f"unknown settings marker {match.group(0)!r}; known: trainer, {SERVICES}")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: replace every marker on the page before it is rendered."""
    return MARKER.sub(_replace, markdown)
