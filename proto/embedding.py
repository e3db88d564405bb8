"""Wire models of the embedding service (``v1``).

``POST /v1/diversity`` speaks the component contract (``ComponentRequest[DiversityParams]``
→ ``ComponentResponse``). ``POST /v1/embeddings`` speaks OpenAI's embeddings API, so the
official ``openai`` client works against it unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import MAX_TEXT_CHARS, ComponentRequest, ComponentResponse
from arbiter.proto.limits import check_texts_total

# Hard cap of the wire model (OpenAI's own limit); the service's setting
# EMBEDDING_MAX_INPUTS may lower it further.
MAX_EMBEDDING_INPUTS = 2048

DiversityNormalize = Literal["none", "group_minmax", "group_zscore"]


class DiversityParams(ArbiterModel):
    normalize: DiversityNormalize = Field(
        default="none",
        description=(
            "How raw diversities 1 − cos(e_i, mean) are rescaled inside each group: "
            "'none' (raw, in [0, 2]); 'group_minmax' ((d − min)/(max − min), all 0 when the "
            "group's values are equal); 'group_zscore' ((d − mean)/std with the population "
            "std, all 0 when std is 0). Null scores take no part."
        ),
    )


DiversityRequest = ComponentRequest[DiversityParams]
DiversityResponse = ComponentResponse

EmbeddingText = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


class EmbeddingRequest(ArbiterModel):
    """OpenAI ``/v1/embeddings`` request. Token-id inputs are not supported."""

    input: Annotated[
        list[EmbeddingText],
        BeforeValidator(_as_list, json_schema_input_type=EmbeddingText | list[EmbeddingText]),
    ] = Field(
        min_length=1,
        max_length=MAX_EMBEDDING_INPUTS,
        description="A string or a list of 1..2048 non-empty strings (a string is read as a "
        "list of one, so errors name `input` or `input.<index>`).",
    )
    model: str = Field(description="The served model name (see GET /v1/models).")
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="'base64': each vector is little-endian float32 bytes, base64-encoded.",
    )
    user: str | None = Field(default=None, max_length=256, description="Accepted, unused.")

    @model_validator(mode="after")
    def _total_chars(self) -> EmbeddingRequest:
        check_texts_total(self.input, "input")
        return self


class EmbeddingData(ArbiterModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(ArbiterModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ArbiterModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    truncated: list[int] = Field(
        default_factory=list,
        description="Indices of inputs cut to the model's max sequence length (an Arbiter "
        "extension; OpenAI clients ignore it).",
    )


class ModelCard(ArbiterModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "arbiter"
    dimensions: int
    max_seq_length: int


class ModelList(ArbiterModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
