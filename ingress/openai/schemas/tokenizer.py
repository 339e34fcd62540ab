"""The HTTP shapes of vLLM's tokenizer routes (which lm-eval's remote tokenizer probes) and of GET /v1/models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ingress.openai.schemas.common import CLOSED_BODY


class TokenizeBody(BaseModel):
    model_config = CLOSED_BODY

    model: str | None = Field(None, description="Must be the served model's name when given.")
    prompt: str = Field(description="Text to tokenize, as a text prompt of /v1/completions is.")
    add_special_tokens: bool = Field(False, description="Add the tokenizer's special tokens (e.g. a BOS); "
                                     "prompts are tokenized without.")


class DetokenizeBody(BaseModel):
    model_config = CLOSED_BODY

    model: str | None = Field(None, description="Must be the served model's name when given.")
    tokens: list[int] = Field(description="Token ids, each in [0, vocab size).")


# Response models: documentation only.

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
