"""Carriers: the only things that cross the ingress <-> worker process boundary.

Plain dataclasses of builtins (no tensors, no engine objects), so they pickle small and the ingress
never imports the engine. Logprob fields keep None ("not requested") and [] ("requested, empty")
distinct; a stream's final chunk carries only what is new, never a replay of earlier chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishType = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress needs to validate requests without a model of its own."""

    model_name: str
    vocab_size: int
    max_model_len: int
    # "raw_logprobs", "raw_logits" or "none".
    logprobs_mode: str


@dataclass(frozen=True)
class TokenizerInfo:
    """The served tokenizer's special tokens and chat template (GET /tokenizer_info, lm-eval's remote
    tokenizer). Strings are as the tokenizer spells them; None where the tokenizer has no such token."""

    model_name: str
    tokenizer_class: str
    vocab_size: int
    max_model_len: int
    eos_token: str | None
    eos_token_id: int | None
    bos_token: str | None
    bos_token_id: int | None
    pad_token: str | None
    pad_token_id: int | None
    chat_template: str | None


@dataclass
class GenerateRequest:
    rid: str
    # Exactly one of input_ids / prompt (the worker tokenizes a prompt, no special tokens added).
    input_ids: list[int] | None = None
    prompt: str | None = None
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0


@dataclass
class FinishInfo:
    type: FinishType
    matched: str | int | None = None
    message: str | None = None
    # With type "error": 400 when the request was invalid (e.g. a text prompt too long once tokenized:
    # the ingress answers HTTP 400 with `message`), 500 when the engine failed.
    code: int | None = None

    def to_json(self) -> dict:
        out: dict = {"type": self.type}
        if self.matched is not None:
            out["matched"] = self.matched
        if self.message is not None:
            out["message"] = self.message
        return out


@dataclass
class GenerateChunk:
    """One delta of a request's answer: what is new since the previous chunk."""

    rid: str
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: FinishInfo | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # [[value, token_id], ...] | None
    input_token_logprobs: list[list] | None = None
    input_top_logprobs: list[list[list]] | None = None
    output_token_logprobs: list[list] | None = None
    output_top_logprobs: list[list[list]] | None = None


@dataclass
class WorkerStats:
    pid: int
    waiting: int
    running: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_used: int
    requests_finished: int
    prefix_cache_hit_tokens: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_evictions: int = 0
    # Where the engine runs ("cpu", "cuda:0") and the GPU slot Ray gave the replica, if any.
    device: str = ""
    cuda_visible_devices: str | None = None
    # Self-protection (engine/admission.py): requests and prompt tokens waiting to start, requests refused as
    # overloaded since start; the process's resident memory now and at its peak; seconds the engine has had work
    # and made no progress (the stuck-engine health check fails past stuck_engine_timeout_s).
    queued: int = 0
    queued_tokens: int = 0
    refused: int = 0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0
    stalled_s: float = 0.0


def merge_chunks(chunks: list[GenerateChunk]) -> GenerateChunk:
    """Concatenate a stream's chunks into the whole answer."""
    if not chunks:
        raise ValueError("no chunks to merge")

    def ext(acc: list | None, new: list | None) -> list | None:
        return acc if new is None else (acc or []) + new

    total = GenerateChunk(rid=chunks[0].rid)
    for c in chunks:
        total.text += c.text
        total.output_ids += c.output_ids
        total.input_token_logprobs = ext(total.input_token_logprobs, c.input_token_logprobs)
        total.input_top_logprobs = ext(total.input_top_logprobs, c.input_top_logprobs)
        total.output_token_logprobs = ext(total.output_token_logprobs, c.output_token_logprobs)
        total.output_top_logprobs = ext(total.output_top_logprobs, c.output_top_logprobs)
        total.finished, total.finish_reason = c.finished, c.finish_reason
        total.prompt_tokens, total.completion_tokens = c.prompt_tokens, c.completion_tokens
        total.cached_tokens = c.cached_tokens
    return total
