"""Carriers: the only things that cross the ingress <-> worker process boundary.

Plain dataclasses of builtins (no tensors, no engine state), so they pickle small and the ingress
never imports the engine's machinery. Logprob fields keep None ("not requested") and [] ("requested,
empty") distinct; a stream's final chunk carries only what is new, never a replay of earlier chunks.

Three pure dataclass modules of the engine are part of this vocabulary, re-exported here so that the ingress
imports only this module (none of them imports torch): the request's SamplingParams (declared once, as
vLLM's EngineCoreRequest carries its SamplingParams), the finish (FinishReason is the engine's FinishReason)
and the one merge of a stream's deltas.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from engine import compact
from engine.outputs import CONCAT, DEFAULT_WEIGHT_VERSION, FinishReason, FinishType, merge_outputs
from engine.sampling_params import SamplingParams

__all__ = [
    "DEFAULT_WEIGHT_VERSION", "ChatPrompt", "FinishReason", "FinishType", "GenerateChunk", "GenerateRequest",
    "ModelInfo", "SamplingParams", "TokenizerInfo", "WeightUpdate", "WeightUpdateResult",
    "WorkerStats", "compact", "error_chunk", "merge_outputs", "until_finished",
]


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress needs to validate requests without a model of its own."""

    model_name: str
    vocab_size: int
    max_model_len: int
    # "raw_logprobs", "processed_logprobs", "raw_logits" or "none".
    logprobs_mode: str
    # The worker's max_prompt_chars_per_token: texts are bounded before anyone tokenizes them.
    prompt_chars_per_token: int = 32
    # Tokens the worker's KV cache holds (prompt + generation of one request at most); None: as many as the context.
    kv_capacity_tokens: int | None = None
    # The worker's queue bounds (engine/core/admission.py): a request whose worker requests exceed them even on an idle
    # worker can never be admitted, and is refused with 400 rather than 503 + Retry-After.
    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    # The worker's logprob limits (engine/config.py; runtime settings of its user_config): the ingress checks a
    # request's worker requests against them before any is sent. None: the ingress's own settings.
    max_top_logprobs: int | None = None
    max_logprob_entries: int | None = None
    # A classifier (*ForSequenceClassification): its labels' count (0: a causal LM), its config's id2label (label
    # index -> name) and problem_type (what vLLM's probabilities apply: softmax, sigmoid or none).
    num_labels: int = 0
    id2label: dict[int, str] = field(default_factory=dict)
    problem_type: str | None = None

    @property
    def classifier(self) -> bool:
        return self.num_labels > 0


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


@dataclass(frozen=True)
class ChatPrompt:
    """Chat messages under the served tokenizer's chat template: the prompt's ids, or why the template refused
    them (`error`: no template, roles it does not accept, ...), which is the client's to fix (a 400)."""

    ids: list[int]
    error: str | None = None


@dataclass
class GenerateRequest:
    """One worker request: a prompt and how to score, sample and stop."""

    rid: str
    # Exactly one of input_ids / prompt (the worker tokenizes a prompt, no special tokens added).
    input_ids: list[int] | None = None
    prompt: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    # The worker requests of one HTTP request share a group (ingress/fan_out.py): the worker admits them as one unit
    # and counts once the first `shared_tokens` of input_ids, which an earlier request of the group has too.
    group: str | None = None
    shared_tokens: int = 0


@dataclass
class GenerateChunk:
    """One delta of a request's answer: what is new since the previous chunk."""

    rid: str
    text: str = field(default="", metadata=CONCAT)
    output_ids: list[int] = field(default_factory=list, metadata=CONCAT)
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # [[value, token_id], ...] | None
    input_token_logprobs: list[list] | None = field(default=None, metadata=CONCAT)
    input_top_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    output_token_logprobs: list[list] | None = field(default=None, metadata=CONCAT)
    output_top_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    # Per scored input position, [[value, token_id], ...] of the request's token_ids_logprob | None.
    input_token_ids_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    # Per scored input position, its token's rank in the row (params.return_input_ranks) | None.
    input_token_ranks: list[int] | None = field(default=None, metadata=CONCAT)
    # Per generated token, [[value, token_id], ...] of the request's token_ids_logprob | None.
    output_token_ids_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    # The request's input_logprob_temperature, echoed; None when it did not set one.
    input_logprob_temperature: float | None = None
    # A classify request's raw float32 scores at its pooled position ([num_labels]), on its final chunk.
    pooled: list[float] | None = None
    # The weights the request ran on (every chunk of a request carries the same: weights change between requests).
    weight_version: str | None = None



@dataclass(frozen=True)
class WeightUpdate:
    """POST /update_weights_from_disk (SGLang's fields): every worker replica loads `model_path`, a checkpoint
    folder each of them can read; None weight_version keeps the current name."""

    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool = False


@dataclass(frozen=True)
class WeightUpdateResult:
    """SGLang's answer: success, a message, and how many requests were in the workers when the update began
    (they finished on the old weights, or were aborted). version: the weights served now."""

    success: bool
    message: str
    num_paused_requests: int = 0
    weight_version: str | None = None


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
    # Self-protection (engine/core/admission.py): requests and prompt tokens waiting to start, requests refused as
    # overloaded since start; the process's resident memory now and at its peak; seconds the engine has had work
    # and made no progress (the stuck-engine health check fails past stuck_engine_timeout_s).
    queued: int = 0
    queued_tokens: int = 0
    refused: int = 0
    rss_bytes: int = 0
    peak_rss_bytes: int = 0
    stalled_s: float = 0.0
    # The weights this replica serves (POST /update_weights_from_disk).
    weight_version: str = DEFAULT_WEIGHT_VERSION
    # Unary calls (generate_whole) served and the requests they held: under load the ingress coalesces concurrent
    # scoring requests into one call (ingress/coalesce.py), so requests / calls is how much it did.
    whole_calls: int = 0
    whole_requests: int = 0
    # SGLang's pause mode while generation is paused (POST /pause_generation), None while generating.
    paused: str | None = None


def error_chunk(rid: str, message: str, code: int | None = None, after: GenerateChunk | None = None) -> GenerateChunk:
    """The final delta of a request that ends in error: nothing new, finish_reason `error` with `message`.

    `code`: 400 when the request was bad, 500 (or None) when the server failed. `after` is the last delta the
    stream sent, if any: its totals repeat (they are totals, not deltas), and a logprob field it carried
    (requested) is [] here while one it did not stays None, so the stream still concatenates.
    """

    def empty_like(name: str) -> list | None:
        return None if after is None or getattr(after, name) is None else []

    return GenerateChunk(
        rid=rid, finished=True, finish_reason=FinishReason("error", message=message, code=code),
        prompt_tokens=after.prompt_tokens if after else 0,
        completion_tokens=after.completion_tokens if after else 0,
        cached_tokens=after.cached_tokens if after else 0,
        input_token_logprobs=empty_like("input_token_logprobs"), input_top_logprobs=empty_like("input_top_logprobs"),
        output_token_logprobs=empty_like("output_token_logprobs"),
        output_top_logprobs=empty_like("output_top_logprobs"),
        input_token_ids_logprobs=empty_like("input_token_ids_logprobs"),
        input_token_ranks=empty_like("input_token_ranks"),
        output_token_ids_logprobs=empty_like("output_token_ids_logprobs"),
        input_logprob_temperature=after.input_logprob_temperature if after else None,
        pooled=after.pooled if after else None, weight_version=after.weight_version if after else None)


async def until_finished(stream: AsyncGenerator[GenerateChunk, None]) -> list[GenerateChunk]:
    """A stream's chunks up to its final one, the stream closed after (which aborts a request left unfinished):
    what a caller that wants the whole answer merges (the worker's generate_whole; the ingress tests' fake)."""
    chunks: list[GenerateChunk] = []
    async with contextlib.aclosing(stream) as s:
        async for chunk in s:
            chunks.append(chunk)
            if chunk.finished:
                break
    return chunks
