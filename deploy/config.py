"""The one typed application config: what `args:` in a Serve YAML file may hold."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.config import DEFAULT_MODEL


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # --- model and engine ----------------------------------------------------------------------
    model: str = Field(DEFAULT_MODEL, description="A Hugging Face checkpoint folder on every node, or "
                       f"'{DEFAULT_MODEL}' for the embedded default model (converted once into cache_dir).")
    model_name: str | None = Field(None, description="Name the server reports for the model; default: `model`.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights and activations. "
                                                             "float32 gives exact logprobs; bfloat16 is the GPU norm.")
    device: str = Field("auto", description="'auto' (CUDA when the replica sees a GPU, else CPU), 'cpu' or 'cuda'.")
    logprobs_mode: Literal["raw_logprobs", "raw_logits", "none"] = Field(
        "raw_logprobs", description="What logprob values mean: log-softmax of raw logits, raw logits, or "
        "logprobs disabled.")
    enable_prefix_cache: bool = Field(True, description="Share full KV blocks across requests (chained block "
                                      "hashes, LRU eviction).")
    hidden_state_store: bool = Field(True, description="Keep each cached position's hidden state so scoring "
                                     "rows in cached blocks skip the transformer; off: reuse only before N.")
    block_size: int = Field(16, gt=0, description="Tokens per KV-cache block.")
    kv_cache_mb: int = Field(512, gt=0, description="KV-cache budget per worker, MiB (K and V of all layers).")
    max_num_batched_tokens: int = Field(2048, gt=0, description="Token budget of one engine step "
                                        "(prefill chunks + one per decoding request).")
    max_num_seqs: int = Field(64, gt=0, description="Most requests in one engine step.")
    score_rows_per_block: int = Field(256, gt=0, description="Rows per LM-head block when scoring: bounds "
                                      "scoring's extra memory to rows x vocab floats.")
    max_model_len: int | None = Field(None, gt=0, description="Longest prompt + generation; default: the model's.")
    num_threads: int | None = Field(None, gt=0, description="torch threads per worker; default: the worker's "
                                    "CPU count (Ray sets OMP_NUM_THREADS=1 in small actors).")
    cache_dir: str | None = Field(None, description="Where the default model is converted; default: the user's "
                                  "cache dir or $RAYSCORE_CACHE_DIR.")

    # --- self-protection (issue 13; figures from bench/limits.py and bench/reliability.py) ------------
    max_top_logprobs: int = Field(100, ge=0, description="Largest top_logprobs_num (and OpenAI logprobs) a request "
                                  "may ask; the ingress answers 400 above it, the engine refuses it too.")
    max_logprob_entries: int = Field(204800, gt=0, description="Most [value, token_id] entries one answer may hold: "
                                     "rows x (1 + top-k). Bounds one request's time, worker memory and bytes.")
    max_request_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Largest HTTP request body, bytes; the "
                                   "ingress answers 413 above it.")
    max_queued_requests: int = Field(64, gt=0, description="Requests a worker holds that have not started; one "
                                     "more is refused at once (503 + Retry-After).")
    max_queued_tokens: int = Field(32768, gt=0, description="Prompt tokens of the requests a worker holds that "
                                   "have not started (an empty queue takes any prompt); beyond it: 503.")
    stuck_engine_timeout_s: float = Field(120.0, gt=0, description="The worker's health check fails (Serve "
                                          "replaces it) when it has work and no engine step finished for this long.")
    worker_max_queued_requests: int = Field(128, description="Serve's max_queued_requests for the workers: requests "
                                            "one ingress replica holds for lack of a worker slot; beyond it the "
                                            "handle raises BackPressureError at once (503). -1: unbounded.")
    graceful_shutdown_timeout_s: float = Field(60.0, ge=0, description="On scale-down, redeploy or shutdown, how "
                                               "long a replica keeps serving its in-flight requests (no new ones).")

    # --- workers ---------------------------------------------------------------------------------
    num_workers: int = Field(1, gt=0, description="Worker replicas when not autoscaling.")
    worker_autoscaling: dict[str, Any] | None = Field(None, description="Serve autoscaling_config for workers "
                                                      "(min_replicas, max_replicas, target_ongoing_requests, ...).")
    worker_num_cpus: float = Field(1.0, ge=0, description="Logical CPUs per worker replica.")
    worker_num_gpus: float = Field(0.0, ge=0, description="GPUs per worker replica (1 on a GPU cluster).")
    worker_max_ongoing_requests: int = Field(64, gt=0, description="Requests Serve sends one worker at once; "
                                             "the engine batches them.")

    prefix_aware_routing: bool = Field(False, description="Send each input_ids request to the worker that was sent "
                                       "the longest prefix of it (workers/router.py); else Serve's power of two.")
    router_block_size: int | None = Field(None, gt=0, description="Tokens per block the router hashes; default: "
                                          "block_size.")
    router_imbalance_threshold: int = Field(8, ge=0, description="Route by prefix only while that worker's queue "
                                            "is at most this many requests longer than the shortest.")

    # --- ingress ---------------------------------------------------------------------------------
    ingress_num_replicas: int = Field(1, gt=0, description="Ingress replicas when not autoscaling.")
    ingress_autoscaling: dict[str, Any] | None = Field(None, description="Serve autoscaling_config for the ingress.")
    ingress_num_cpus: float = Field(0.5, ge=0, description="Logical CPUs per ingress replica.")

    # --- HTTP (for `python -m deploy.run`; with `serve run` the YAML's http_options rule) -------------
    http_host: str = Field("127.0.0.1", description="Address the HTTP proxy binds.")
    http_port: int = Field(8000, gt=0, lt=65536, description="Port of the HTTP proxy.")

    def engine_config(self) -> dict[str, Any]:
        """Plain kwargs for engine.config.EngineConfig (built inside the worker process)."""
        threads = self.num_threads or (max(1, int(self.worker_num_cpus)) if self.worker_num_gpus == 0 else None)
        return dict(model=self.model, dtype=self.dtype, device=self.device, block_size=self.block_size,
                    kv_cache_bytes=self.kv_cache_mb * 1024 * 1024,
                    max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
                    score_rows_per_block=self.score_rows_per_block, logprobs_mode=self.logprobs_mode,
                    enable_prefix_cache=self.enable_prefix_cache, hidden_state_store=self.hidden_state_store,
                    max_model_len=self.max_model_len, num_threads=threads, cache_dir=self.cache_dir,
                    max_queued_requests=self.max_queued_requests, max_queued_tokens=self.max_queued_tokens,
                    max_top_logprobs=self.max_top_logprobs, max_logprob_entries=self.max_logprob_entries,
                    stuck_engine_timeout_s=self.stuck_engine_timeout_s)
