"""OpenAI graders as OpenAI's API reference defines them, and the graders API's bodies.

A grader is a JSON specification of a reward (https://developers.openai.com/api/docs/guides/
graders): ``string_check``, ``text_similarity``, ``python``, ``score_model``,
``label_model``, or ``multi`` (sub-graders combined by ``calculate_output``). Field names,
types and defaults follow the ``openai`` package's own models (``openai.types.graders``);
what Arbiter refuses that OpenAI may take is said on each field and in
docs/services/graders.md. The same models serve a recipe component written
``{"name", "weight", "grader": {...}}`` and ``POST /v1/fine_tuning/alpha/graders/{run,
validate}``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from arbiter.proto.common import ArbiterModel
from arbiter.proto.gateway import JsonObject
from arbiter.proto.limits import MAX_TEXT_CHARS, MAX_WEIGHT
from arbiter.proto.sandbox import MAX_GRADER_SOURCE_CHARS, PythonGraderParams

MAX_TEMPLATE_CHARS = 20_000  # a template (input, reference, a message's content)
MAX_FORMULA_CHARS = 500  # calculate_output
MAX_SUB_GRADERS = 16
MAX_MESSAGES = 32
MAX_LABELS = 64

Template = Annotated[str, Field(max_length=MAX_TEMPLATE_CHARS)]
GraderName = Annotated[str, Field(min_length=1, max_length=128)]

TextSimilarityMetric = Literal[
    "cosine",  # through the embedding service
    "fuzzy_match",  # rapidfuzz
    "bleu",  # nltk
    "gleu",  # nltk
    "meteor",  # refused here (422): nltk's METEOR needs WordNet, which PyPI does not ship
    "rouge_1",  # rouge-score, F-measure
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]


class StringCheckGrader(ArbiterModel):
    """1.0 when the check holds, else 0.0: ``eq`` equal, ``ne`` not equal, ``like``
    ``reference`` is inside ``input``, ``ilike`` the same ignoring case."""

    type: Literal["string_check"]
    name: GraderName
    input: Template = Field(description="The text checked; may hold templates.")
    reference: Template = Field(description="The text checked against; may hold templates.")
    operation: Literal["eq", "ne", "like", "ilike"]


class TextSimilarityGrader(ArbiterModel):
    """How similar ``input`` is to ``reference``, from 0 to 1, by ``evaluation_metric``."""

    type: Literal["text_similarity"]
    name: GraderName
    input: Template
    reference: Template
    evaluation_metric: TextSimilarityMetric

    @field_validator("evaluation_metric")
    @classmethod
    def _supported(cls, metric: str) -> str:
        if metric == "meteor":
            raise ValueError(
                "'meteor' is unsupported here: nltk's METEOR needs the WordNet corpus, which "
                "no PyPI package ships and this deployment does not download; use 'bleu', "
                "'gleu', 'rouge_l' or 'cosine'"
            )
        return metric


class PythonGrader(ArbiterModel):
    """``grade(sample, item) -> float`` run in the sandbox (``python_grader``)."""

    type: Literal["python"]
    name: GraderName
    source: str = Field(min_length=1, max_length=MAX_GRADER_SOURCE_CHARS)
    image_tag: str | None = Field(
        default=None,
        max_length=128,
        description="Accepted and ignored: the sandbox has one image (its packages are listed "
        "in docs/services/sandbox.md).",
    )

    @field_validator("source")
    @classmethod
    def _compiles(cls, source: str) -> str:
        try:  # compiles, defines grade(): the sandbox's own rule
            PythonGraderParams(source=source)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return source


class ContentText(ArbiterModel):
    type: Literal["input_text", "output_text"]
    text: Template


class InputMessage(ArbiterModel):
    """One message to the grader model. Text content only here: images and audio are
    refused (the judge's model reads text)."""

    role: Literal["user", "assistant", "system", "developer"]
    content: Template | ContentText | list[Template | ContentText] = Field(
        description="A string, a text part, or a list of them; each may hold templates."
    )
    type: Literal["message"] | None = None


class SamplingParams(ArbiterModel):
    max_completions_tokens: int | None = Field(default=None, ge=1, le=4096)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        Field(default=None, description="Accepted and ignored: the judge's server decides.")
    )
    seed: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)


class _ModelGrader(ArbiterModel):
    model: str = Field(
        min_length=1,
        max_length=256,
        description="Recorded in the answer's metadata; the judge service's own model grades "
        "(one deployment serves one judge model).",
    )
    input: list[InputMessage] = Field(min_length=1, max_length=MAX_MESSAGES)


class ScoreModelGrader(_ModelGrader):
    """The judge model's score of the sample, inside ``range`` (default [0, 1])."""

    type: Literal["score_model"]
    name: GraderName
    range: list[float] | None = Field(default=None, description="[min, max]; default [0, 1].")
    sampling_params: SamplingParams | None = None

    @field_validator("range")
    @classmethod
    def _range(cls, value: list[float] | None) -> list[float] | None:
        if value is None:
            return None
        ok = len(value) == 2 and all(math.isfinite(v) and abs(v) <= MAX_WEIGHT for v in value)
        if not ok or value[0] >= value[1]:
            raise ValueError(f"expected [min, max], min < max, finite, at most {MAX_WEIGHT:g}")
        return value


class LabelModelGrader(_ModelGrader):
    """The judge model picks one of ``labels``: 1.0 when it is in ``passing_labels``."""

    type: Literal["label_model"]
    name: GraderName
    labels: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        min_length=1, max_length=MAX_LABELS
    )
    passing_labels: list[str] = Field(min_length=1, max_length=MAX_LABELS)

    @model_validator(mode="after")
    def _subset(self) -> LabelModelGrader:
        extra = [p for p in self.passing_labels if p not in self.labels]
        if extra:
            raise ValueError(f"passing_labels: {extra[0]!r} is not one of labels")
        return self


SubGrader = Annotated[
    StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader,
    Field(discriminator="type"),
]


class MultiGrader(ArbiterModel):
    """Sub-graders combined by ``calculate_output``, an arithmetic formula over their names
    (the keys of ``graders``; a single grader: its ``name``)."""

    type: Literal["multi"]
    name: GraderName
    graders: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], SubGrader] | (
        SubGrader
    ) = Field(description="name -> grader (the guide's form), or one grader (the SDK's type).")
    calculate_output: str = Field(min_length=1, max_length=MAX_FORMULA_CHARS)

    @field_validator("graders")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, dict) and not 1 <= len(value) <= MAX_SUB_GRADERS:
            raise ValueError(f"expected 1 to {MAX_SUB_GRADERS} graders")
        return value

    def named(self) -> dict[str, Any]:
        """The sub-graders by the names the formula uses."""
        if isinstance(self.graders, dict):
            return dict(self.graders)
        return {self.graders.name: self.graders}


Grader = Annotated[
    StringCheckGrader
    | TextSimilarityGrader
    | PythonGrader
    | ScoreModelGrader
    | LabelModelGrader
    | MultiGrader,
    Field(discriminator="type"),
]


class GraderRunRequest(ArbiterModel):
    """``POST /v1/fine_tuning/alpha/graders/run``."""

    grader: Grader
    model_sample: str = Field(
        max_length=MAX_TEXT_CHARS,
        description="The sample: {{ sample.output_text }}, and {{ sample.output_json }} "
        "when it is valid JSON.",
    )
    item: JsonObject | None = Field(
        default=None, description="The dataset row: {{ item.* }} and python's item."
    )


class GraderValidateRequest(ArbiterModel):
    """``POST /v1/fine_tuning/alpha/graders/validate``."""

    grader: Grader


class GraderValidateResponse(ArbiterModel):
    grader: Grader | None = None


class GraderErrors(ArbiterModel):
    """OpenAI's error flags: each true when that failure happened (``*_details``: why)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False


class GraderRunMetadata(ArbiterModel):
    errors: GraderErrors
    execution_time: float = Field(description="Seconds the grading took.")
    name: str
    sampled_model_name: str | None = None
    scores: dict[str, Any] = Field(
        description="Each sub-grader's score by name (multi), else the grader's own."
    )
    token_usage: int | None = Field(default=None, description="Judge tokens, model graders.")
    type: str


class GraderRunResponse(ArbiterModel):
    """OpenAI's ``GraderRunResponse``. ``reward`` is null (never 0) when the grader could not
    compute it; ``metadata.errors`` says why."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    reward: float | None
    metadata: GraderRunMetadata
    sub_rewards: dict[str, Any]
    model_grader_token_usage_per_model: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(ArbiterModel):
    role: Literal["user", "assistant", "system", "developer"]
    content: str = Field(max_length=MAX_TEXT_CHARS)


class ModelGraderRequest(ArbiterModel):
    """The judge's ``POST /v1/model_grader``: one ``score_model`` or ``label_model``
    grader (its JSON without ``input``) and, per sample, its rendered messages."""

    params: ScoreModelGrader | LabelModelGrader = Field(discriminator="type")
    messages: list[list[ChatMessage]] = Field(min_length=1, max_length=4096)


class ModelGraderResult(ArbiterModel):
    score: float | None = Field(description="null: see kind and message.")
    kind: str | None = None
    message: str = ""
    result: Any = Field(default=None, description="The model's own result: a number or label.")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens: int = 0


class ModelGraderResponse(ArbiterModel):
    results: list[ModelGraderResult]
