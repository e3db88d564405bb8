"""Chat messages as the text Arbiter scores (shared by the framework adapters).

A conversation is a list of ``{"role", "content"}`` messages whose content is a string
or a list of parts (``{"type": "text", "text": …}``, images…). The response scored is the
last *assistant* message (a tool result after it is not the model's answer); the question
is the last *user* message. ``first_reason`` words the warning both adapters give about
scores that could not be computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arbiter.proto.gateway import ScoreError


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])  # {"type": "text", "text": …}; images etc. skipped
        return "".join(texts)
    raise TypeError(f"content must be a string or a list of parts, not {type(content).__name__}")


def _last(messages: list[Any], role: str, what: str) -> dict[str, Any]:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == role:
            return message
    roles = [m.get("role") if isinstance(m, dict) else type(m).__name__ for m in messages]
    raise ValueError(f"{what} has no {role!r} message to score (roles: {roles})")


def completion_text(completion: Any) -> str:
    """The text to score: the completion itself, or its last assistant message (not a
    tool result that follows it)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return content_text(_last(completion, "assistant", "completion").get("content"))
    raise TypeError(f"a completion must be text or messages, not {type(completion).__name__}")


def prompt_text(prompt: Any) -> str:
    """The question: the prompt itself, or its last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return content_text(_last(prompt, "user", "prompt").get("content"))
    raise TypeError(f"a prompt must be text or messages, not {type(prompt).__name__}")


def first_reason(errors: Sequence[ScoreError], warned: set[str]) -> tuple[str, str] | None:
    """The first error's kind and reason (``component: message``), or None when a warning
    about that kind was already given (``warned`` records it: once per process and kind)."""
    first = errors[0] if errors else None
    kind = first.kind if first is not None else "unknown"
    if kind in warned:
        return None
    warned.add(kind)
    return kind, f"{first.component}: {first.message}" if first is not None else "no reason given"
