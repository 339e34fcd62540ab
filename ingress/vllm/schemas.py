"""vLLM 0.32's token-in / token-out shapes (vllm/entrypoints/scale_out/token_in_token_out/protocol.py): the
request body of POST /inference/v1/generate with the `sampling_params` fields this server honours, and the answer's
models for OpenAPI. Type errors are 422s; every rule on values is a 400 of rulebook/vllm_generate.py. Fields outside
these models are checked by name on the raw body (rulebook/vllm_generate.py), so `extra="allow"` keeps them for
that check and nothing is dropped unseen.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TokenSampling(BaseModel):
    """vLLM's SamplingParams, the honoured fields (null: vLLM's default)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")

    max_tokens: int | None = Field(None, description="Tokens to generate (at least 1); unset: up to the context.")
    temperature: float | None = Field(None, description="In [0, 2]; below 1e-5: greedy. Default 1.")
    top_p: float | None = None
    top_k: int | None = Field(None, description="0 or -1: no top-k filter.")
    min_p: float | None = None
    seed: int | None = Field(None, description="-1: none.")
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    logprobs: int | None = Field(None, description="Per generated token: the sampled token and the k most likely.")
    prompt_logprobs: int | None = Field(None, description="Per prompt position: the prompt token (with its rank) "
                                        "and the k most likely; -1: the whole vocabulary.")
    prompt_logprob_token_ids: list[list[int]] | None = Field(
        None, description="Per scored prompt row, its own candidate ids ([rows][k]); -1 pads a row and scores -inf. "
        "Row i scores prompt token prompt_logprob_start + i + 1.")
    prompt_logprob_start: int | None = Field(None, description="The first scored row of prompt_logprob_token_ids.")
    logprob_token_ids: list[int] | None = Field(None, description="Ids scored at every generated token (at most "
                                                "128); `logprobs`, if set, must equal their count.")
    flat_logprobs: bool | None = Field(None, description="vLLM's FlatLogprobs: prompt_logprobs' row 0 is {}.")
    detokenize: bool | None = Field(None, description="false: decoded_token is null.")
    skip_special_tokens: bool | None = None
    n: int | None = Field(None, description="1 only.")


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class TokenGenerateBody(BaseModel):
    """vLLM's GenerateRequest (token in, token out)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")

    request_id: str | None = Field(None, description="The answer's request_id is `generate-tokens-<request_id>`; "
                                   "either form aborts it (/inference/v1/abort_requests).")
    token_ids: list[int] = Field(min_length=1, description="The prompt's token ids.")
    sampling_params: TokenSampling = Field(description="vLLM's SamplingParams (docs/vllm.md: the honoured fields).")
    model: str | None = Field(None, description="The served model, or a loaded LoRA adapter's name.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = Field(None, description="Also answer the prompt's ids (prompt_token_ids).")
    output_mode: str = Field("tokens", description="'tokens' only ('text' is a 400).")
    content_parts: list[Any] | None = Field(
        None, description="The prompt's images, in order: {\"type\": \"image_url\", \"url\": \"data:image/...\"} "
        "(optional uuid); token_ids hold one placeholder run per image (docs/multimodal.md).")


class AbortRequestsBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    request_ids: list[str] | None = None


class TokenLogprob(BaseModel):
    token_id: int
    logprob: float
    rank: int | None = None


class TokenLogprobContent(TokenLogprob):
    top_logprobs: list[TokenLogprob] = []


class WeightVersionSpan(BaseModel):
    version: str
    start: int
    end: int


class TokenChoice(BaseModel):
    index: int
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: None = None
    sampling_mask: None = None
    weight_versions: list[WeightVersionSpan] | None = None
    logprobs: dict[Literal["content"], list[TokenLogprobContent]] | None = None


class TokenGenerateResponse(BaseModel):
    request_id: str
    model: str | None = None
    created: int | None = None
    usage: dict[str, Any] | None = None
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None
    prompt_token_id_logprobs: str | None = Field(None, description="base64 of a .npy float32 array [rows, k].")
    prompt_token_ids: list[int] | None = None
    output_mode: Literal["tokens"] = "tokens"
    choices: list[TokenChoice]
