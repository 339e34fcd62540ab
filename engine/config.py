"""Engine configuration: plain frozen data, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LogprobsMode = Literal["raw_logprobs", "raw_logits", "none"]
DType = Literal["float32", "bfloat16", "float16"]

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EngineConfig:
    # A Hugging Face checkpoint folder, or the name of the embedded default model.
    model: str = DEFAULT_MODEL
    dtype: DType = "float32"
    # "auto": CUDA when present, else CPU.
    device: str = "auto"
    # Tokens per KV block.
    block_size: int = 16
    # KV cache budget in bytes (K and V of every layer). num_kv_blocks overrides it when set.
    kv_cache_bytes: int = 512 * 1024 * 1024
    num_kv_blocks: int | None = None
    # Per step: at most this many tokens (prefill chunks + one per decoding request) ...
    max_num_batched_tokens: int = 2048
    # ... and at most this many requests.
    max_num_seqs: int = 64
    # The LM head + log-softmax of scoring runs over blocks of this many rows: the extra memory of
    # scoring is bounded by score_rows_per_block x vocab floats whatever the prompt length.
    score_rows_per_block: int = 256
    logprobs_mode: LogprobsMode = "raw_logprobs"
    # Share full KV blocks across requests by a chained hash of their tokens; keep them (LRU) after use.
    enable_prefix_cache: bool = True
    # Keep each cached position's last hidden state too, so a scoring row in a cached block comes from the LM
    # head alone. Off: cached blocks are reused only before the scoring boundary N (SGLang's rule).
    hidden_state_store: bool = True
    # Longest prompt + generation; None: the model's max_position_embeddings.
    max_model_len: int | None = None
    # torch intra-op threads; None leaves torch's default (Ray sets OMP_NUM_THREADS=1 in small actors).
    num_threads: int | None = None
    # Where the embedded default model is converted to safetensors; None: the user's cache dir.
    cache_dir: str | None = None
    # --- self-protection (engine/admission.py, engine/async_engine.py) ---
    # Requests accepted but not started (no step has computed any of them): one more is refused at once with a
    # 503-coded error instead of queuing. Measured (bench/limits.py): see README "Reliability".
    max_queued_requests: int = 64
    # Prompt tokens of those requests: ~10 s of prefill for SmolLM2 on 2 CPU cores. An empty queue takes any
    # prompt, so a long prompt is never refused forever.
    max_queued_tokens: int = 32768
    # Largest top_logprobs_num, and most logprob entries (rows x (1 + k)) one request may return: what one
    # request may cost the worker in time, memory and answer bytes (bench/limits.py measures it).
    max_top_logprobs: int = 100
    max_logprob_entries: int = 204800
    # The worker's health check fails when work is pending and no engine step has finished for this long:
    # busy is fine (a step is bounded by max_num_batched_tokens), stuck is not.
    stuck_engine_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.score_rows_per_block <= 0:
            raise ValueError(f"score_rows_per_block must be positive, got {self.score_rows_per_block}")
        for name in ("max_queued_requests", "max_queued_tokens", "max_logprob_entries", "stuck_engine_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_top_logprobs < 0:
            raise ValueError(f"max_top_logprobs must be non-negative, got {self.max_top_logprobs}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.logprobs_mode not in ("raw_logprobs", "raw_logits", "none"):
            raise ValueError(f"unknown logprobs_mode {self.logprobs_mode!r}")
