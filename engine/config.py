"""Engine configuration: plain frozen data, validated once at construction.

Each field's `doc` metadata describes it; the deploy edge (deploy/config.py) builds its typed config from
these fields, their types, defaults and docs, so nothing here is restated there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from protocol.images import MERGE
from rulebook.limits import MAX_LOGPROB_ENTRIES, MAX_TOP_LOGPROBS

LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "none"]
DType = Literal["float32", "bfloat16", "float16"]
AttentionChoice = Literal["auto", "torch", "varlen"]
HeadDType = Literal["model", "float32"]

DEFAULT_MODEL = "smollm2-135m-instruct"
# Scoring chunk rows where none is derived (CPU, batch-invariant mode): engine/runner/score_chunks.py.
CPU_SCORE_ROWS = 256

# What a running engine changes between two steps (LLMEngine.apply_runtime), with no rebuild of its model, KV cache
# or CUDA graphs: the worker's Serve `user_config`. Not max_num_seqs: the decode graphs and the invariant mode's
# checks are sized by it. Every other field is fixed at start (an `args` field: changing it restarts the workers).
RUNTIME_FIELDS = ("max_num_batched_tokens", "long_prefill_token_threshold", "max_queued_requests",
                  "max_queued_tokens", "max_prompt_chars_per_token", "max_top_logprobs", "max_logprob_entries",
                  "stuck_engine_timeout_s", "pause_timeout_s")
_NULLABLE = ("long_prefill_token_threshold",)
UNKNOWN_RUNTIME_FIELD = ("user_config field `{name}` is not a runtime setting of the worker; these are: {fields} "
                         "(every other setting is an `args` field, and changing it restarts the replicas).")


def _doc(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class EngineConfig:
    model: str = _doc(DEFAULT_MODEL, "A Hugging Face checkpoint folder on every node, a hub id (org/name) in every "
                      "node's local Hugging Face cache (never downloaded), or "
                      f"'{DEFAULT_MODEL}' for the embedded default model (converted once into cache_dir).")
    dtype: DType = _doc("float32", "Weights and activations. float32 gives exact logprobs; bfloat16 is the GPU norm.")
    # vLLM's `hf_overrides={"head_dtype": "float32"}`, SGLang's --enable-fp32-lm-head: the final norm runs in the
    # model dtype and its output is upcast, then the head's weight (engine/layers/linear.py's float32_linear).
    head_dtype: HeadDType = _doc("model", "The final norm's output and the LM head (or a classifier's score head): "
                                 "'model' computes them in dtype; 'float32' upcasts the norm's output and the "
                                 "head's weight and projects in float32, as vLLM's head_dtype and SGLang's fp32 LM "
                                 "head do (a bfloat16 head moves low-probability tokens' logprobs by whole nats). "
                                 "No effect with dtype float32.")
    device: str = _doc("auto", "'auto' (CUDA when the replica sees a GPU, else CPU), 'cpu' or 'cuda'.")
    block_size: int = _doc(16, "Tokens per KV-cache block.")
    kv_cache_bytes: int = _doc(512 * 1024 * 1024, "KV-cache budget, bytes (K and V of all layers).")
    num_kv_blocks: int | None = _doc(None, "KV-cache blocks; overrides the byte budget when set.")
    max_num_batched_tokens: int = _doc(2048, "Token budget of one engine step (prefill chunks + one per "
                                       "decoding request).")
    max_num_seqs: int = _doc(64, "Most requests in one engine step.")
    # vLLM's knob of the same name; here the budget left after everyone's turn goes back to the long prefill,
    # so one alone still fills the step. Figures: bench/features/long_prefill.py.
    long_prefill_token_threshold: int | None = _doc(None, "Most tokens one request's prefill takes in a step "
                                                    "before the other requests have had theirs (the budget left "
                                                    "then goes back to it): a short request is not held behind a "
                                                    "long prompt. Default: max_num_batched_tokens / 4.")
    # engine/core/image_budget.py: patches, the unit the tower's activations grow with; vLLM's
    # max_num_batched_encoder_embeds counts the merged tokens (patches / 4) and defaults to max_num_batched_tokens.
    max_image_patches_per_step: int | None = _doc(None, "Image budget of a vision-language model: vision-tower "
                                                  "patches (an image's rows before the 2 x 2 merger; 4 per image "
                                                  "token) encoded and not yet consumed at once. A step runs the "
                                                  "tower only for images that fit what the held ones leave; a chunk "
                                                  "that reaches another waits before that image's run. An image "
                                                  "larger than the budget runs alone. Default: 4 x "
                                                  "max_num_batched_tokens (as many image tokens as a step's token "
                                                  "budget).")
    # The LM head + log-softmax of scoring runs over chunks of this many rows: the extra memory of scoring is
    # bounded by about rows x vocab x 4 bytes whatever the prompt length (engine/runner/score_chunks.py).
    score_rows_per_block: int | None = _doc(None, "Rows per LM-head chunk when scoring: bounds scoring's extra "
                                            "memory to rows x (vocab x 4 + 49,152) bytes (one float32 copy of "
                                            "the logits and one slice's temporaries). Default: 256 on CPU (and in "
                                            "batch-invariant mode); on CUDA as many as fit in a quarter of the "
                                            "memory free once the KV cache is allocated, at most 8192.")
    # processed_logprobs is vLLM's name: the engine computes logprobs as in raw_logprobs, but a generated token's are
    # of logits / temperature; the OpenAI routes score a prompt (prompt_logprobs) at the request's temperature.
    logprobs_mode: LogprobsMode = _doc("raw_logprobs", "What logprob values mean: log-softmax of raw logits "
                                       "(raw_logprobs); the same after the request's temperature for generated "
                                       "tokens and vLLM's prompt_logprobs (processed_logprobs); raw logits; or "
                                       "logprobs disabled (none).")
    enable_prefix_cache: bool = _doc(True, "Share full KV blocks across requests (chained block hashes, LRU "
                                     "eviction).")
    # Off: cached blocks are reused only before the scoring boundary N (SGLang's rule).
    hidden_state_store: bool = _doc(True, "Keep each cached position's hidden state so scoring rows in cached "
                                    "blocks skip the transformer; off: reuse only before N.")
    # docs/design/models.md (hybrid linear attention): a snapshot is one request's state, state_bytes_per_slot.
    hybrid_state_interval: int = _doc(2048, "Hybrid models (Qwen3.5): keep the linear layers' state every this many "
                                      "tokens of a cached prefix (a multiple of block_size), so a shared prefix "
                                      "resumes from its last snapshot; each costs one request's state, charged per "
                                      "cached token (state / interval) from kv_cache_bytes; 0: no prefix reuse for "
                                      "hybrids.")
    # engine/invariant/mode.py: fixed matmul tiles, block attention from position 0, tiled log-softmax, no shortcut.
    batch_invariant: bool = _doc(False, "Batch-invariant mode: a request's values have the same float bits whatever "
                                 "else runs, wherever its chunks fall and whatever is cached (slower: "
                                 "python -m bench invariant).")
    # engine/runner/attention_choice.py; docs/design/gpu.md.
    attention_backend: AttentionChoice = _doc("auto", "'auto': one varlen attention call per layer per step on "
                                              "CUDA when torch's flash kernel serves the model, else the torch "
                                              "paged path; 'torch': always the torch paged path; 'varlen': the "
                                              "varlen backend, its pure-torch reference kernel where the CUDA one "
                                              "cannot run.")
    cuda_graphs: bool = _doc(True, "Replay decode-only steps from CUDA graphs captured per batch-size bucket "
                             "(CUDA with the varlen kernel only; no effect on CPU).")
    max_model_len: int | None = _doc(None, "Longest prompt + generation; default: the model's.")
    # engine/parallel/: rank 0 is the engine's own process; the worker starts the other ranks (workers/ranks.py).
    tensor_parallel_size: int = _doc(1, "Ranks (devices) one worker splits the model over: attention heads, MLP "
                                     "rows and the LM head's vocabulary; kv_cache_mb is per rank. 1: one device.")
    # engine/parallel/pipeline.py: stage s is world ranks [s x TP, (s + 1) x TP); the stages may be on other nodes.
    pipeline_parallel_size: int = _doc(1, "Pipeline stages one worker cuts the layers into, each a tensor-parallel "
                                       "group of tensor_parallel_size ranks (one node each); activations go stage "
                                       "to stage. 1: no pipeline.")
    # engine/llm_engine.py's step: disjoint requests per step in flight; the rows are the same either way.
    pipeline_overlap: bool = _doc(True, "With pipeline_parallel_size P > 1: keep up to P engine steps in flight, "
                                  "each with its own requests, so the stages overlap (stage 1 runs a step while "
                                  "stage 0 runs the next); false: one step at a time, faster where the stages "
                                  "share CPU cores rather than own a GPU or node each. No effect with one stage.")
    expert_parallel: bool = _doc(False, "With tensor_parallel_size N > 1: each rank holds E/N whole experts of "
                                 "every mixture-of-experts block (num_experts divisible by N) instead of 1/N of "
                                 "every expert's width (the default). No effect on dense models or one rank.")
    # Ray sets OMP_NUM_THREADS=1 in small actors, so a worker sets this from its CPU count (deploy/config.py).
    num_threads: int | None = _doc(None, "torch intra-op threads; default: torch's own.")
    cache_dir: str | None = _doc(None, "Where the default model is converted; default: the user's cache dir or "
                                 "$RAYSCORE_CACHE_DIR.")
    # --- LoRA adapters (engine/runner/lora.py) ---
    lora_adapters: dict[str, str] | None = _doc(None, "LoRA adapters (PEFT folders) served by name, {name: path}; more "
                                                "are loaded at run time (POST /v1/load_lora_adapter).")
    max_loras: int = _doc(4, "Adapters resident at once per worker (least recently used evicted, reloaded on "
                          "demand); requests of that many adapters share one engine step, and a request for one "
                          "more waits in the queue until a slot frees (never refused for it).")
    max_lora_rank: int = _doc(16, "Largest adapter rank served (an adapter above it is refused, 400).")
    # --- self-protection (engine/core/admission.py, engine/async_engine.py; figures: bench/features/limits.py) ---
    max_queued_requests: int = _doc(64, "Requests a worker holds that have not started (no engine step yet); one "
                                    "more is refused at once with a 503-coded error, before it is queued.")
    # ~10 s of prefill for SmolLM2 on 2 CPU cores.
    max_queued_tokens: int = _doc(32768, "Prompt tokens of the requests a worker holds that have not started; "
                                  "beyond it: refused (503). An empty queue takes any prompt.")
    max_prompt_chars_per_token: int = _doc(32, "A text prompt (or chat, or /tokenize text) longer than "
                                           "max_model_len x this many characters is refused (400) before it is "
                                           "tokenized: it could not fit the context.")
    # 2,000 rows x (1 + 100): seconds of worker time, ~250 MiB of worker memory, a ~5 MB answer
    # (bench/features/limits.py).
    max_top_logprobs: int = _doc(MAX_TOP_LOGPROBS, "Largest top_logprobs_num (OpenAI `logprobs`) a request may "
                                 "ask (400 above it).")
    max_logprob_entries: int = _doc(MAX_LOGPROB_ENTRIES, "Most [value, token_id] entries one answer may hold: "
                                    "rows x (1 + top-k). Bounds one request's time, worker memory and answer "
                                    "bytes (400).")
    # A step is bounded by max_num_batched_tokens: a legitimate one ends in seconds, even on a slow CPU.
    stuck_engine_timeout_s: float = _doc(120.0, "The worker's health check fails (Serve replaces it) when it has "
                                         "work and no engine step has finished for this long; busy is not stuck.")

    pause_timeout_s: float = _doc(300.0, "While generation is paused (POST /pause_generation), a request waits at "
                                  "most this long for POST /continue_generation, then ends with 503.")

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_cache_bytes", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hybrid_state_interval < 0 or self.hybrid_state_interval % self.block_size:
            raise ValueError(f"hybrid_state_interval must be 0 or a positive multiple of block_size "
                             f"({self.block_size}), got {self.hybrid_state_interval}")
        if self.tensor_parallel_size <= 0:
            raise ValueError(f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}")
        if self.pipeline_parallel_size <= 0:
            raise ValueError(f"pipeline_parallel_size must be positive, got {self.pipeline_parallel_size}")
        if self.pipeline_parallel_size > 1 and self.batch_invariant:
            raise ValueError("batch_invariant is not available with pipeline_parallel_size > 1: the stages score "
                             "through the split head, whose summation order the mode does not fix")
        if self.pipeline_parallel_size > 1 and self.lora_adapters:
            raise ValueError("lora_adapters are not served with pipeline_parallel_size > 1 yet: each stage holds "
                             "its own layers, and adapters are not cut by stage")
        if self.tensor_parallel_size > 1 and self.batch_invariant:
            raise ValueError("batch_invariant is not available with tensor_parallel_size > 1: the all-reduces' "
                             "summation order is not held fixed across ranks")
        if self.max_loras <= 0 or self.max_lora_rank <= 0:
            raise ValueError("max_loras and max_lora_rank must be positive")
        if self.lora_adapters and self.batch_invariant:
            raise ValueError("lora_adapters are served with batch_invariant off only: an adapter's delta is not "
                             "computed in the invariant mode's fixed tiles")
        for name in ("max_queued_requests", "max_queued_tokens", "max_logprob_entries", "stuck_engine_timeout_s",
                     "pause_timeout_s", "max_prompt_chars_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_top_logprobs < 0:
            raise ValueError(f"max_top_logprobs must be non-negative, got {self.max_top_logprobs}")
        for name in ("num_kv_blocks", "max_model_len", "num_threads", "long_prefill_token_threshold",
                     "score_rows_per_block", "max_image_patches_per_step"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive when set, got {value}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.head_dtype not in ("model", "float32"):
            raise ValueError(f"head_dtype must be model or float32, got {self.head_dtype!r}")
        if self.float32_head and self.batch_invariant:
            raise ValueError("head_dtype float32 is not available with batch_invariant and a bfloat16/float16 dtype: "
                             "the mode's checked matmul tiles are the model dtype's")
        if self.attention_backend not in ("auto", "torch", "varlen"):
            raise ValueError(f"attention_backend must be auto, torch or varlen, got {self.attention_backend!r}")
        if self.logprobs_mode not in ("raw_logprobs", "processed_logprobs", "raw_logits", "none"):
            raise ValueError(f"unknown logprobs_mode {self.logprobs_mode!r}")

    def with_runtime(self, changes: Mapping[str, Any] | None) -> EngineConfig:
        """This config with `changes` (a worker's Serve `user_config`) applied: RUNTIME_FIELDS only, validated as at
        construction; ValueError naming the field otherwise (the deploy fails, the engine keeps its settings)."""
        changes = dict(changes or {})
        for name, value in changes.items():
            if name not in RUNTIME_FIELDS:
                raise ValueError(UNKNOWN_RUNTIME_FIELD.format(name=name, fields=", ".join(RUNTIME_FIELDS)))
            # A YAML value of the wrong type must not reach the scheduler: the types are int, int | None and float.
            kind = float if isinstance(getattr(self, name), float) else int
            if isinstance(value, bool) or not (isinstance(value, kind | int) or (value is None and name in _NULLABLE)):
                raise ValueError(f"user_config field `{name}` must be {'a number' if kind is float else 'an integer'}"
                                 f"{' or null' if name in _NULLABLE else ''}, got {value!r}")
        budget = changes.get("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.batch_invariant and budget > self.max_num_batched_tokens:
            # The invariant mode checked its matmul row plans for steps up to the start-up budget (invariant/mode.py).
            raise ValueError(f"max_num_batched_tokens cannot rise above {self.max_num_batched_tokens} in place with "
                             "batch_invariant on (its checks covered steps up to that size): change it in `args`")
        return replace(self, **changes)

    @property
    def world_size(self) -> int:
        """The ranks one worker replica runs on: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def image_patch_budget(self) -> int:
        """max_image_patches_per_step, or its default: the patches of max_num_batched_tokens image tokens."""
        return self.max_image_patches_per_step or MERGE * MERGE * self.max_num_batched_tokens

    @property
    def value_mode(self) -> str:
        """What the scoring rows hold: processed_logprobs scores as raw_logprobs (its temperature is the request's,
        given per row), so the scorer and the vocab-parallel head know three modes only."""
        return "raw_logprobs" if self.logprobs_mode == "processed_logprobs" else self.logprobs_mode

    @property
    def float32_head(self) -> bool:
        """Whether the head's projection is upcast: head_dtype float32 on a bfloat16/float16 model."""
        return self.head_dtype == "float32" and self.dtype != "float32"
