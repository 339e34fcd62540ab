"""The HTTP shapes of the OpenAI-compatible routes: request bodies FastAPI validates, response models for OpenAPI.

Bodies follow OpenAI's legacy completions API (and vLLM's tokenizer routes, which lm-eval's remote
tokenizer probes). Type errors are 422s; value errors are left to validation.py, whose 400s name
the offending field in `param`. Every error of these routes has OpenAI's shape (`OpenAIErrorBody`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Fields OpenAI clients send as `null` to mean "the default" are `X | None`; the defaults apply in
# validation.py. strict / allow_inf_nan / extra="ignore" as in schemas.GenerateBody: ints are
# taken where a float belongs, NaN is not, and fields this server has no use for are ignored.
STRICT_BODY = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

Prompt = str | list[str] | list[int] | list[list[int]]


class StreamOptions(BaseModel):
    model_config = STRICT_BODY

    include_usage: bool | None = Field(False, description="Send one last chunk with `usage` and no choices.")


class SamplingFields(BaseModel):
    """What completions and chat completions share: sampling, stopping, streaming, and the OpenAI parameters
    this server refuses rather than ignores."""

    model_config = STRICT_BODY

    model: str | None = Field(None, description="Must be the served model's name (GET /v1/models) when given.")
    temperature: float | None = Field(1.0, description="0 is greedy.")
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


class CompletionBody(SamplingFields):
    """Request body of `POST /v1/completions` (OpenAI legacy completions)."""

    prompt: Prompt = Field(description="A string, a list of strings, a list of token ids, or a list of "
                           "token-id lists: one choice per prompt, `index` in order.")
    max_tokens: int | None = Field(16, description="Tokens to generate; 0 (with `echo`) scores the prompt only.")
    echo: bool | None = Field(False, description="Return the prompt (and its logprobs) before the completion.")
    logprobs: int | None = Field(None, description="Logprobs of each token and of the k (0-20) most likely "
                                 "alternatives per position; null: none.")
    best_of: int | None = Field(None, description="Only null or 1.")
    suffix: str | None = Field(None, description="Not supported: only null.")


class TokenizeBody(BaseModel):
    model_config = STRICT_BODY

    model: str | None = Field(None, description="Must be the served model's name when given.")
    prompt: str = Field(description="Text to tokenize, as a text prompt of /v1/completions is.")
    add_special_tokens: bool = Field(False, description="Add the tokenizer's special tokens (e.g. a BOS); "
                                     "prompts are tokenized without.")


class DetokenizeBody(BaseModel):
    model_config = STRICT_BODY

    model: str | None = Field(None, description="Must be the served model's name when given.")
    tokens: list[int] = Field(description="Token ids, each in [0, vocab size).")


# Response models: documentation only (the routes build their JSON by hand, see render.py).

class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(description="Each token decoded alone: the prompt's (with `echo`), then the "
                              "completion's.")
    token_logprobs: list[float | None] = Field(description="log p(token | everything before it); null for "
                                               "the first prompt token, which nothing predicts.")
    top_logprobs: list[dict[str, float] | None] = Field(description="Per position, the `logprobs` most "
                                                         "likely tokens and the actual one, {text: logprob}.")
    text_offset: list[int] = Field(description="Where each token starts in `text`: the summed lengths of "
                                   "the tokens before it.")


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None = Field(description="null on streamed chunks but the last.")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """One JSON answer, or one streamed chunk (then with one choice's delta, or only `usage`)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int
    root: str | None = Field(None, description="A LoRA adapter's folder.")
    parent: str | None = Field(None, description="A LoRA adapter's base model.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str


class OpenAIError(BaseModel):
    message: str
    type: Literal["invalid_request_error", "authentication_error", "not_found_error", "server_error",
                  "timeout_error"]
    param: str | None
    code: int = Field(description="The HTTP status.")


class OpenAIErrorBody(BaseModel):
    error: OpenAIError

