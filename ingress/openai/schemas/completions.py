"""The HTTP shapes of `POST /v1/completions` (OpenAI legacy completions, with vLLM's extensions): the request body
FastAPI validates, response models for OpenAPI."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ingress.openai.schemas.common import SamplingFields, Usage

Prompt = str | list[str] | list[int] | list[list[int]]


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


# Response models: documentation only (the route builds its JSON by hand, see render/completions.py).

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


class CompletionResponse(BaseModel):
    """One JSON answer, or one streamed chunk (then with one choice's delta, or only `usage`)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None
