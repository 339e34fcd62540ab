"""SGLang's /generate request shapes (its GenerateReqInput and SamplingParams, the fields this server honours).

Type errors are 422s, as for the seed's shape; every rule about values is a 400 of rulebook/sglang.py or of the
shared rulebook. Fields of SGLang's that this server does not implement are checked by name on the raw body before
these models see it (rulebook/sglang.py), so `extra="ignore"` drops only fields that are no part of SGLang's shape.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SGLangSampling(BaseModel):
    """One prompt's `sampling_params`, as SGLang reads it (None means SGLang's default)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    max_new_tokens: int | None = Field(128, description="Tokens to generate; 0: score only; null: up to the context.")
    temperature: float | None = Field(None, description="0 is greedy (SGLang: top_k 1).")
    top_p: float | None = None
    top_k: int | None = Field(None, description="-1 or any value >= the vocabulary size: no top-k filter.")
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    # Fast tokenizers (every one this server loads) decode the same either way, as in SGLang.
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = Field(None, description="Keep the matched stop string in the text.")
    n: int | None = Field(None, description="Samples per prompt: the answer is a list of prompts x n.")
    sampling_seed: int | None = Field(None, description="Per-request sampling seed.")


class SGLangBody(BaseModel):
    """SGLang's `POST /generate` body: told apart from the seed's shape by `sampling_params` or `text`."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    text: str | list[str] | None = Field(None, description="The prompt as text, or a batch of them.")
    input_ids: list[int] | list[list[int]] | None = Field(None, description="Token ids, or a batch of id lists.")
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None, description="SGLang's sampling parameters (one object, or one per prompt).")
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = Field(
        None, description="Input positions from which input_token_logprobs are returned (entry 0, the position "
        "itself, is null); -1 (default): output tokens only.")
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | list[list[list[int]]] | None = Field(
        None, description="Token ids whose logprobs are returned at each position: one list for all, per prompt of "
        "a batch, or (on-policy distillation) per scored row: one list per token of input_ids[logprob_start_len+1:].")
    token_ids_logprob_positions: list[list[int]] | None = Field(
        None, description="SGLang's per-position form (PR #27421/#38119): one id list per input position, indexed by "
        "the absolute position of the token it is scored against; positions up to logprob_start_len stay empty. "
        "Single requests only; not with token_ids_logprob.")
    input_logprob_temperature: float | None = Field(
        None, description="rayscore's extension: input rows at log_softmax(logits / T).")
    return_text_in_logprobs: bool = False
    lora_path: str | list[str | None] | None = Field(
        None, description="The LoRA adapter by its loaded name (GET /v1/models lists them), one for every item.")
    return_flat_logprobs_b64: bool = Field(
        False, description="rayscore's extension: meta_info's logprob fields as flat base64 arrays (little-endian "
        "float32 values, int32 ids) with their shapes, entry 0's null as `<field>_null_prefix` (docs/vllm.md).")
    stream: bool = False
    rid: str | list[str] | None = None
    image_data: str | list[str | list[str] | None] | None = Field(
        None, description="The prompt's images (data: URLs or base64 bytes): one, a list, or for a batch one entry "
        "per prompt; the prompt holds one placeholder run per image (docs/multimodal.md).")
