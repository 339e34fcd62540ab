"""The ingress's metrics, through Ray's metrics agent (`ray.util.metrics`), tagged by model, replica and route.

Written once per HTTP request from its finished RequestRecord (request_id.py calls `IngressMetrics.observe`).
Prometheus sees each name with Ray's `ray_` prefix (`ray_rayscore_requests_total`).
"""

from __future__ import annotations

from ray.util.metrics import Counter, Histogram

from ingress.edge.request_record import RequestRecord
from ingress.errors import CLIENT_CLOSED_REQUEST

TAGS = ("model", "replica", "route")
SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
TOKENS_PER_SECOND = [10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000]

# 499 (CLIENT_CLOSED_REQUEST): the client went away; not a refusal. Other 4xx, 429 and 503 are refusals; other 5xx
# are failures.
_REJECTION_REASONS = {400: "invalid_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
                      413: "too_large", 422: "invalid_body", 429: "overloaded", 503: "unavailable"}


def rejection_reason(record: RequestRecord) -> str | None:
    """Why the request was refused, or None when it was not."""
    if record.reject_reason is not None:
        return record.reject_reason
    status = record.status
    if status == CLIENT_CLOSED_REQUEST or not (400 <= status < 500 or status == 503):
        return None
    return _REJECTION_REASONS.get(status, f"http_{status}")


class IngressMetrics:
    def __init__(self, replica: str) -> None:
        self._requests = Counter("rayscore_requests_total", "HTTP requests answered, by route, kind (scoring: "
                                 "max_tokens 0; generation; classify; none), finish reason and HTTP status.",
                                 tag_keys=(*TAGS, "kind", "finish_reason", "status"))
        self._rejections = Counter("rayscore_rejections_total", "HTTP requests refused (4xx, 429, 503), by reason.",
                                   tag_keys=(*TAGS, "reason"))
        self._ttfb = Histogram("rayscore_time_to_first_byte_seconds", "Arrival at the ingress to the first byte "
                               "of the answer.", boundaries=SECONDS, tag_keys=TAGS)
        self._latency = Histogram("rayscore_request_latency_seconds", "Arrival at the ingress to the last byte of "
                                  "the answer (end to end).", boundaries=SECONDS, tag_keys=TAGS)
        self._scoring_rate = Histogram("rayscore_scoring_tokens_per_second", "Prompt tokens per second of each "
                                       "successful scoring request, end to end.", boundaries=TOKENS_PER_SECOND,
                                       tag_keys=TAGS)
        self._replica = replica

    def observe(self, r: RequestRecord) -> None:
        tags = {"model": r.model or "unknown", "replica": self._replica, "route": r.route}
        self._requests.inc(1, tags={**tags, "kind": r.kind or "none", "finish_reason": r.finish_reason or "none",
                                    "status": str(r.status)})
        if (reason := rejection_reason(r)) is not None:
            self._rejections.inc(1, tags={**tags, "reason": reason})
        if r.first_byte_s is not None:
            self._ttfb.observe(r.first_byte_s, tags=tags)
        if r.latency_s is not None:
            self._latency.observe(r.latency_s, tags=tags)
            if r.kind in ("scoring", "classify") and r.status == 200 and r.prompt_tokens and r.latency_s > 0:
                self._scoring_rate.observe(r.prompt_tokens / r.latency_s, tags=tags)
