"""What the ingress enforces on every request: limits, deadlines, retries and API keys.

Plain data, built by deploy/ from the app config (whose field names the error messages quote, so a client
learns which setting raises a limit) and handed to `build_fastapi_app`. Defaults equal AppConfig's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class IngressSettings:
    # Limits, checked before any work is queued (limits.py, edge/middleware.py); each is an AppConfig field.
    max_top_logprobs: int = 100  # top-k per position (/generate top_logprobs_num, OpenAI logprobs)
    max_logprob_entries: int = 204_800  # [value, id] entries one request may return: rows x (1 + k)
    max_request_bytes: int = 4 * 1024 * 1024  # HTTP body, bytes (413 above)
    # Seconds a request may take from arrival to its last byte; None: no deadline.
    request_timeout_s: float | None = 600.0
    # How long after its worker failed a request may still be run again elsewhere (retry.py); 0: never.
    retry_deadline_s: float = 60.0
    # Accepted bearer keys; empty: no authentication (edge/auth.py). Kept out of repr: settings may be logged.
    api_keys: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive or None, got {self.request_timeout_s}")
        if self.retry_deadline_s < 0:
            raise ValueError(f"retry_deadline_s must be non-negative, got {self.retry_deadline_s}")
