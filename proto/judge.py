"""Judge service: ``POST /v1/quality`` (rubric score) and ``POST /v1/verifier`` (P(Yes)).

Both take the uniform ``ComponentRequest`` (groups of prompt, reference, responses) and
answer ``ComponentResponse``; these are their params. The judge model sits behind any
OpenAI-compatible chat-completions server (vLLM in production).
"""

from __future__ import annotations

from pydantic import Field

from arbiter.proto.common import ArbiterModel
from arbiter.proto.components import ComponentRequest

QUALITY_DIMENSIONS = ("correctness", "reasoning", "clarity", "overall")

# Fixed text, sent first (system message) so the server's prefix cache serves it to every
# call. ``{scale}`` is replaced by the scale's maximum; nothing else is substituted.
DEFAULT_RUBRIC = """\
You are a strict grader of answers to math word problems. Read the question, the \
reference answer when one is given, and the response. Rate the response on each \
dimension with a whole number from 1 (worst) to {scale} (best):
- correctness: is the final answer right (compare it with the reference when given)?
- reasoning: are the steps valid, relevant and free of errors?
- clarity: is it easy to follow, concise, and in the requested format?
- overall: your overall judgement of the response's quality; a wrong final answer \
cannot score above 2.
Reply with one JSON object and nothing else, exactly with these keys: \
{"correctness": n, "reasoning": n, "clarity": n, "overall": n}"""

DEFAULT_VERIFIER_INSTRUCTION = """\
You are a strict grader. Decide whether the response answers the question correctly \
(compare its final answer with the reference answer when one is given). Reply with a \
single word: Yes or No."""


class QualityParams(ArbiterModel):
    rubric: str = Field(
        default=DEFAULT_RUBRIC,
        min_length=1,
        max_length=20_000,
        description="System message: the grading rubric. '{scale}' is replaced by `scale`.",
    )
    scale: int = Field(default=5, ge=2, le=10, description="Ratings run from 1 to `scale`.")
    show_reference: bool = Field(
        default=True, description="Show the group's reference answer to the judge."
    )
    temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="The judge's sampling temperature (0: greedy)."
    )
    max_tokens: int = Field(
        default=96, ge=8, le=4096, description="Budget for the judge's JSON reply."
    )


class VerifierParams(ArbiterModel):
    instruction: str = Field(
        default=DEFAULT_VERIFIER_INSTRUCTION,
        min_length=1,
        max_length=20_000,
        description="System message: asks for a one-word Yes/No verdict.",
    )
    show_reference: bool = Field(
        default=True, description="Show the group's reference answer to the judge."
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=5,
        le=100_000,
        description="Top log-probs to read Yes/No from; null = the service's setting. "
        "vLLM refuses more than 20 unless started with --max-logprobs.",
    )
    constrain_labels: bool | None = Field(
        default=None,
        description="Send vLLM's structured_outputs choice [Yes, No] so both labels are in "
        "the top log-probs (the Yes/No ratio is unchanged); null = the service's setting.",
    )


QualityRequest = ComponentRequest[QualityParams]
VerifierRequest = ComponentRequest[VerifierParams]
