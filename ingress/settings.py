"""What the ingress enforces on every request: limits, deadlines, retries and API keys.

Plain frozen data, validated once at construction, each field described by its `doc` metadata. The deploy edge
(deploy/config.py) builds its typed config from these fields, their types, defaults and docs, as it does from
EngineConfig, so nothing here is restated there; the error messages quote the field names, so a client learns
which setting raises a limit. The two logprob limits are the engine's fields too: their defaults are the
rulebook's, and deploy/ passes the engine's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rulebook.limits import MAX_LOGPROB_ENTRIES, MAX_TOP_LOGPROBS


def _doc(default: Any, doc: str, **kwargs: Any) -> Any:
    return field(default=default, metadata={"doc": doc}, **kwargs)


@dataclass(frozen=True)
class IngressSettings:
    # Limits, checked before any work is queued (limits.py, edge/middleware.py).
    max_top_logprobs: int = MAX_TOP_LOGPROBS  # top-k per position (/generate top_logprobs_num, OpenAI logprobs)
    max_logprob_entries: int = MAX_LOGPROB_ENTRIES  # [value, id] entries one request may return: rows x (1 + k)
    # Fan-out and field bounds (limits.py): one client's valid-looking request must not cost the workers more than
    # their queues hold, nor every generated token a scan of a million stop strings.
    max_batch_items: int = _doc(32, "Most worker requests one HTTP request may make: /generate batch items, "
                                "OpenAI prompts, /v1/score items (400 above it).")
    max_stop_strings: int = _doc(16, "Most stop strings one request may give (400 above it).")
    max_stop_string_chars: int = _doc(256, "Longest stop string, characters (400 above it).")
    max_stop_token_ids: int = _doc(256, "Most stop_token_ids one request may give (400 above it).")
    max_token_ids_logprob: int = _doc(256, "Most token ids one request may list in token_ids_logprob (400 above "
                                      "it); each scored row reports them all (counted in max_logprob_entries).")
    max_rid_chars: int = _doc(256, "Longest request id (rid, X-Request-ID), characters (400 above it).")
    max_request_bytes: int = _doc(4 * 1024 * 1024, "Largest HTTP request body, bytes; the ingress answers 413 above "
                                  "it.")
    body_timeout_s: float = _doc(30.0, "Seconds the ingress waits for a request's whole body once its headers are in; "
                                 "then it answers 408 and closes the connection (a slow client must not hold a slot).")
    request_timeout_s: float | None = _doc(600.0, "Seconds a request may take from arrival to its last byte; then "
                                           "it is aborted (504, or an error event mid-stream). null: no deadline.")
    # retry.py
    retry_deadline_s: float = _doc(60.0, "A request whose worker died before any byte was sent runs again on "
                                   "another (or the replacement) worker for up to this long after the failure; "
                                   "0: never.")
    # transport/coalesce.py: a short request's worker call costs as much serving CPU as its engine share on a GPU.
    coalesce_max_in_flight: int = _doc(8, "Non-streamed worker calls one ingress replica has out at once before the "
                                       "scoring requests (max_tokens 0, or 1: a prompt's logprobs and one token) "
                                       "that arrive meanwhile are sent together as one call. Keep it at least twice "
                                       "the most workers (fewer calls than workers leave some idle); 0: every "
                                       "request its own call.")
    coalesce_max_tokens: int = _doc(2048, "Most tokens (prompt and new) in one coalesced worker call; a scoring "
                                    "request larger than this is sent alone.")
    model_info_ttl_s: float = _doc(60.0, "How long the ingress trusts its copy of the workers' model info (their "
                                   "runtime limits, user_config) without a worker's answer: every answer carries "
                                   "the workers' model-info version, and one that differs (a user_config change, a "
                                   "weight update) refreshes the copy at once; past this time without answers a "
                                   "request starts a refresh in the background (one worker call outside any "
                                   "request, which takes a place in the worker deployment's queue).")
    # Images (ingress/images.py, rulebook/images.py): decoded and preprocessed here, in a thread.
    max_images_per_request: int = _doc(8, "Most images one request may carry, over all its messages or items (400 "
                                       "above it).")
    max_image_pixels: int = _doc(16_777_216, "Most pixels (width x height) of one image, read from its header before "
                                 "it is decoded, so a decompression bomb costs nothing (400 above it).")
    allow_image_urls: bool = _doc(False, "Whether an image may be given as an http(s) URL (chat image_url, SGLang "
                                  "image_data), which the ingress then fetches, bounded by max_request_bytes and "
                                  "body_timeout_s. Off: such a URL is a 400 asking for a data: URL (servers often "
                                  "have no network, and a fetch holds the request on a third party).")
    # Accepted bearer keys; empty: no authentication (edge/auth.py). Kept out of repr: settings may be logged.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # Keys the admin routes (weight updates, cache flush) take; a plain api_key never opens them (edge/auth.py).
    admin_api_keys: tuple[str, ...] = field(default=(), repr=False)
    # Closed by default: with no admin key configured, anyone who can reach the server could otherwise pause it.
    open_admin_routes: bool = _doc(False, "Open the admin routes (pause, continue, abort, weight updates, adapter "
                                   "loading, cache flush) without an admin key to every client that passes the API-key "
                                   "check: only on a trusted network. Default: they answer 401 unless "
                                   "`admin_api_keys` is set and the client sends one (when set, it is always "
                                   "required).")

    def __post_init__(self) -> None:
        for name in ("max_batch_items", "max_stop_strings", "max_stop_string_chars", "max_stop_token_ids",
                     "max_token_ids_logprob", "max_rid_chars", "max_images_per_request", "max_image_pixels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_request_bytes <= 0:
            raise ValueError(f"max_request_bytes must be positive, got {self.max_request_bytes}")
        if not 0 < self.body_timeout_s < float("inf"):
            raise ValueError(f"body_timeout_s must be positive and finite, got {self.body_timeout_s}")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive or None, got {self.request_timeout_s}")
        if self.coalesce_max_in_flight < 0 or self.coalesce_max_tokens <= 0:
            raise ValueError("coalesce_max_in_flight must be non-negative and coalesce_max_tokens positive, got "
                             f"{self.coalesce_max_in_flight} and {self.coalesce_max_tokens}")
        if not 0 < self.model_info_ttl_s < float("inf"):
            raise ValueError(f"model_info_ttl_s must be positive and finite, got {self.model_info_ttl_s}")
        if self.retry_deadline_s < 0:
            raise ValueError(f"retry_deadline_s must be non-negative, got {self.retry_deadline_s}")
