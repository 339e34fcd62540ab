"""What the OpenAI-compatible routes' bodies share: the body config, sampling and stopping fields, usage and
OpenAI's error body.

Type errors are 422s; value errors are left to the routes' validation, whose 400s name the offending field in
`param`. Every error of these routes has OpenAI's shape (`OpenAIErrorBody`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Fields OpenAI clients send as `null` to mean "the default" are `X | None`; the defaults apply in
# validation.py. The objects inside a body (a message, a content part, stream_options): strict (ints are taken
# where a float belongs, NaN is not), and a field they do not declare is a 422 naming it, never dropped.
STRICT_BODY = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
# The completion and chat bodies keep the fields they do not declare (`model_extra`), so that each one is judged by
# rulebook/openai_fields.py: accepted if it only annotates, else a 400 naming it, never silently dropped.
BODY = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")
# Bodies of the routes that are nobody's standard but their own (/v1/score, /tokenize, /detokenize): a field they do
# not declare is a 422 naming it (pydantic's extra_forbidden), not silently dropped.
CLOSED_BODY = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

class StreamOptions(BaseModel):
    model_config = STRICT_BODY

    include_usage: bool | None = Field(False, description="Send one last chunk with `usage` and no choices.")


class SamplingFields(BaseModel):
    """What completions and chat completions share: sampling, stopping, streaming, and the OpenAI parameters
    this server refuses rather than ignores."""

    model_config = BODY

    model: str | None = Field(None, description="Must be the served model's name (GET /v1/models) when given.")
    temperature: float | None = Field(1.0, description="Below 1e-5 (0 included) is greedy.")
    top_p: float | None = Field(1.0, description="Nucleus mass, in (0, 1].")
    n: int | None = Field(1, description="Only 1: one choice per prompt.")
    stop: str | list[str] | None = Field(None, description="Stop string(s); not part of the returned text.")
    seed: int | None = Field(None, description="Per-request sampling seed.")
    stream: bool | None = Field(False, description="Server-sent chunks ending with `data: [DONE]`.")
    stream_options: StreamOptions | None = Field(None, description="Only with `stream`.")
    presence_penalty: float | None = Field(0.0, description="Not supported: only 0.")
    frequency_penalty: float | None = Field(0.0, description="Not supported: only 0.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported: only null or {}.")
    user: str | None = None
    # Extensions with vLLM's names, passed to the sampler as /generate does.
    top_k: int | None = Field(-1, description="-1 disables top-k.")
    min_p: float | None = Field(0.0, description="Minimum probability relative to the top token, in [0, 1].")
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's: what TRL's teacher scoring and generation read (docs/vllm.md).
    prompt_logprobs: int | None = Field(None, description="vLLM's: the logprob of every prompt token after the "
                                        "first, with its rank and the k most likely tokens (-1: the whole "
                                        "vocabulary, within `max_top_logprobs`), as `prompt_logprobs` (a choice's "
                                        "on /v1/completions, the answer's on chat). Not with `stream` unless 0.")
    logprob_token_ids: list[int] | None = Field(None, description="vLLM's: ids scored at every generated token (at "
                                                "most 128), reported in place of the k most likely; needs "
                                                "`logprobs`.")
    return_token_ids: bool | None = Field(None, description="vLLM's: also `prompt_token_ids` and each choice's "
                                          "`token_ids` (the generated ids).")
    return_tokens_as_token_ids: bool | None = Field(None, description="vLLM's: logprob tokens as "
                                                    "`token_id:<id>` strings instead of their text.")
    return_flat_logprobs_b64: bool = Field(False, description="Logprobs as flat base64 arrays (little-endian "
                                           "float32 values, int32 ids) with their shapes, SGLang's `*_flat_b64` "
                                           "names: docs/vllm.md, compact format.")


# Response models shared by the routes: documentation only (the routes build their JSON by hand, see render/).

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class OpenAIError(BaseModel):
    message: str
    type: Literal["invalid_request_error", "authentication_error", "not_found_error", "server_error",
                  "timeout_error"]
    param: str | None
    code: int = Field(description="The HTTP status.")


class OpenAIErrorBody(BaseModel):
    error: OpenAIError

