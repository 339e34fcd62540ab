"""The HTTP shapes of `/generate`: the request body FastAPI validates, and response models for OpenAPI.

Type errors are the contract's 422s; value errors (negative max_tokens, out-of-range sampling values,
...) are left to `validation.py`, whose 400s come in the contract's order with the contract's text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class GenerateBody(BaseModel):
    """Request body of `POST /generate` (the contract: docs/api.md)."""

    # strict: "5" is not an int and `true` is not an int either (bool subclasses int in Python, and lax
    # mode would take [true] as [1]); ints are still accepted where a float belongs.
    # allow_inf_nan=False: Python's JSON parser accepts NaN/Infinity, which no sampling value can mean.
    # extra="ignore": clients of LMDeploy/SGLang send fields this server has no use for (session_id,
    # ...); ignoring them is harmless, whereas a 422 would break those clients for nothing.
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    # A list of lists (of strings) is a batch, as SGLang takes it: one worker request per item, the answer a
    # list in the items' order (docs/api.md, "/generate batches").
    adapter: str | None = Field(None, description="The LoRA adapter to run with, by name (GET /v1/models lists "
                                "them); null: the base model.")
    lora_path: str | list[str | None] | None = Field(None, description="SGLang's name for `adapter` (a batch's list "
                                                    "must name one adapter).")
    input_ids: list[int] | list[list[int]] | None = Field(
        None, description="The prompt as token ids, or a batch of them (a list of id lists); exactly one of "
        "input_ids / prompt."
    )
    prompt: str | list[str] | None = Field(
        None, description="The prompt as text, tokenized without a chat template, or a batch of them (a list)."
    )
    image_data: Any = Field(None, description="Not supported: any non-null value is rejected (400).")
    max_tokens: int = Field(128, description="Tokens to generate; 0 means scoring only.")
    stream: bool = Field(False, description="Answer with server-sent events instead of one JSON body.")
    return_logprob: bool | None = Field(None, description="Return logprobs of generated (and scored) tokens.")
    # ge=-1 makes `< -1` a type-level (422) error, as the contract says; everything else about the
    # boundary is a 400 of rule 9.
    logprob_start_len: int = Field(-1, ge=-1, description="Scoring boundary N; -1 = no input-token scoring.")
    top_logprobs_num: int | None = Field(
        None, description="Also return the k most likely tokens per position."
    )
    input_logprob_temperature: float | None = Field(
        None, description="Scoring rows (and their top-k and token-id values) are log_softmax(logits / T) at this "
        "temperature: at least 1e-5, finite; default 1. Input-token scoring only (logprob_start_len >= 0); sampling "
        "keeps `temperature`. Echoed as meta_info.input_logprob_temperature."
    )
    token_ids_logprob: list[int] | list[list[int]] | None = Field(
        None, description="Token ids whose values are reported at every scored input position "
        "(meta_info.input_token_ids_logprobs, in the order given); at most max_token_ids_logprob of them. Or a list "
        "of lists, one per scored row (input_ids[logprob_start_len+1:], in order): each row's own candidates."
    )
    return_flat_logprobs_b64: bool = Field(
        False, description="meta_info's logprob fields as flat base64 arrays (little-endian float32 values, int32 "
        "ids) with their shapes, under SGLang's `<field>_val_flat_b64` / `_idx_flat_b64` / `_shape` names "
        "(docs/vllm.md, compact format)."
    )
    temperature: float = Field(1.0, description="Below 1e-5 (0 included) is greedy.")
    top_p: float = Field(1.0, description="Nucleus mass, in (0, 1].")
    top_k: int = Field(-1, description="-1 disables top-k.")
    min_p: float = Field(0.0, description="Minimum probability relative to the top token, in [0, 1].")
    seed: int | None = Field(None, description="Per-request sampling seed.")
    stop: str | list[str] | None = Field(None, description="Stop string(s).")
    stop_token_ids: list[int] | None = Field(None, description="Token ids that end generation.")
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    rid: str | list[str] | None = Field(
        None, description="Request id, echoed as meta_info.id; made when absent. A batch takes a list, one per item."
    )


# Response models: documentation only. The routes build their JSON by hand (render.py) so that a
# missing `matched` stays absent and None vs [] survive exactly; FastAPI never re-serializes them.

LogprobRow = list[Any]  # [value, token_id]
_ABSENT = "null, or absent in SGLang's dialect, without return_logprob."


class FinishReasonSchema(BaseModel):
    """How /generate writes the carrier's FinishReason (protocol/outputs.py): its error `code` is the HTTP status."""

    type: Literal["stop", "length", "abort", "error"]
    matched: str | int | None = Field(None, description="The stop string or token id that ended generation.")
    message: str | None = Field(None, description="Why an `error` finish happened.")


class MetaInfo(BaseModel):
    id: str
    finish_reason: FinishReasonSchema | None = Field(description="null on every streamed event but the last.")
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # SGLang's dialect (a body with `sampling_params` or `text`) answers as SGLang does: the logprob fields only with
    # return_logprob, and a null entry where a position has no list (the boundary row, a row without top-k).
    input_token_logprobs: list[LogprobRow | None] | None = Field(None, description=_ABSENT)
    input_top_logprobs: list[list[LogprobRow] | None] | None = Field(None, description=_ABSENT)
    output_token_logprobs: list[LogprobRow | None] | None = Field(None, description=_ABSENT)
    output_top_logprobs: list[list[LogprobRow] | None] | None = Field(None, description=_ABSENT)
    input_token_ids_logprobs: list[list[LogprobRow] | None] | None = Field(
        None, description="Only with token_ids_logprob: per scored row, [value, token_id] of each id asked.")
    input_logprob_temperature: float | None = Field(None, description="Only when the request set it.")
    weight_version: str | None = Field(description="The weights that computed the answer (all of it: weights "
                                       "change between requests only); see POST /update_weights_from_disk.")


class GenerateResponse(BaseModel):
    """One JSON answer, or one streamed event (then holding only what is new since the previous one)."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class ErrorBody(BaseModel):
    object: Literal["error"] = "error"
    message: str
    type: str
    code: int
    param: None = None


class HealthBody(BaseModel):
    status: Literal["ok", "paused", "unavailable"]
    pause_mode: str | None = Field(None, description="SGLang's pause mode while generation is paused (status "
                                   "paused): requests wait at most `pause_timeout_s`, then answer 503.")
