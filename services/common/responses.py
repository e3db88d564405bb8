"""The one way a route answers: ``JSONBody``, JSON serialised once.

A route that returned its pydantic model would have FastAPI validate it again against
``response_model`` before dumping it; ``JSONBody`` skips that second pass. Its content is
a wire model (dumped by pydantic-core) or bytes the handler already rendered in that
model's shape (the gateway's ``/v1/score``, built from plain lists on its hot path). The
route's ``response_model`` stays, for the OpenAPI schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.responses import Response


class JSONBody(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, BaseModel):
            return content.__pydantic_serializer__.to_json(content)
        if isinstance(content, bytes):
            return content
        raise TypeError(f"JSONBody takes a pydantic model or rendered bytes, not {type(content)}")
