"""What a worker tells the ingress about itself: the served model's limits, its tokenizer, its load."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

from protocol.outputs import DEFAULT_WEIGHT_VERSION


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress needs to validate requests without a model of its own."""

    model_name: str
    vocab_size: int
    max_model_len: int
    # "raw_logprobs", "processed_logprobs", "raw_logits" or "none".
    logprobs_mode: str
    # The checkpoint folder the workers load (the embedded model's converted folder, or the config's): each ingress
    # replica loads the tokenizer and chat template from it (ingress/text.py). "": unknown (tests' fakes).
    model_path: str = ""
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
    # A vision-language model's placeholder ids (its config's image_token_id, vision_start_token_id,
    # vision_end_token_id): what the ingress writes around an image. None: the model takes no images.
    image_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    # The workers' model-info version: a digest of every field above and of the weights served (model_info_version),
    # so that every replica of one configuration tells the same. Each answer carries it (RequestOutput.info_version):
    # the ingress asks again only when an answer's differs (a user_config change, a weight update) or when no answer
    # has come for long (ingress/transport/worker_client.py). "": not told (tests' fakes).
    version: str = ""

    @property
    def classifier(self) -> bool:
        return self.num_labels > 0

    @property
    def takes_images(self) -> bool:
        return self.image_token_id is not None


def model_info_version(info: ModelInfo, weight_version: str) -> str:
    """The version of `info` (its `version` aside) on weights `weight_version`: equal on every replica that serves
    them under the same settings, different after any change of either."""
    # kv_capacity_tokens is each replica's own (its device's free memory at start): replicas that differ only there
    # must not make the ingress refresh at every switch between them.
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)
              if f.name not in ("version", "kv_capacity_tokens")}
    digest = hashlib.blake2b(repr((sorted(fields.items()), weight_version)).encode(), digest_size=8)
    return digest.hexdigest()


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
    # scoring requests into one call (ingress/transport/coalesce.py), so requests / calls is how much it did.
    whole_calls: int = 0
    whole_requests: int = 0
    # Streaming calls (generate) served: with whole_calls, every request-carrying call this replica took.
    stream_calls: int = 0
    # The pause's mode while generation is paused (SGLang's /pause_generation, vLLM's /pause), None while generating.
    paused: str | None = None
    # Images put through the vision tower since start (engine/runner/vision.py): an image sent again whose blocks are
    # all in the prefix cache adds none.
    vision_tower_runs: int = 0
