"""What an error may echo back of its input: valid Unicode, and not much of it.

An error names the offending field (``param``, a dotted path through the body) and its
message often quotes a value. Two things must never come back:

- a lone UTF-16 surrogate: JSON can spell one in a key as well as a value
  (``{"\\ud800": 1}``), and the path that names it then holds it; the envelope could not
  be encoded, and the caller got a 500 (``PydanticSerializationError``) for a 422. Each is
  written as its escape, ``\\ud800``, which names it exactly;
- megabytes of input: a 1 MB recipe name came back in a 1 MB 422. A message is cut at
  ``MAX_MESSAGE_CHARS`` and a ``param`` at ``MAX_PARAM_CHARS``, saying how long it was.

``clean_envelope`` applies both to an envelope just before it is encoded; every error
answer of every service passes through it (``app.error_response``, ``limits._refuse``).
"""

from __future__ import annotations

import re

from arbiter.proto.errors import ErrorResponse

MAX_MESSAGE_CHARS = 1000
MAX_PARAM_CHARS = 200
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str, limit: int) -> str:
    """``text`` with lone surrogates escaped, cut to ``limit`` characters (saying so)."""
    cut = text[:limit]
    if _SURROGATE.search(cut):  # an escape is 6 characters: the cut is checked after it
        cut = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", cut)
    if len(text) <= limit and len(cut) <= limit:
        return cut
    return f"{cut[:limit]}… ({len(text)} characters)"


def clean_envelope(body: ErrorResponse) -> ErrorResponse:
    """The envelope with its message and ``param`` safe to encode and short (in place)."""
    error = body.error
    error.message = clean_text(error.message, MAX_MESSAGE_CHARS)
    if error.param is not None:
        error.param = clean_text(error.param, MAX_PARAM_CHARS)
    if error.code is not None:
        error.code = clean_text(error.code, MAX_PARAM_CHARS)
    return body
