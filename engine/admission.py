"""A bounded queue in front of the engine: requests that were accepted but have not started (no engine step
has computed any of them yet) and their prompt tokens. One request more than the bounds is refused at once,
before it is queued, so that a flood costs the worker a counter, not memory or minutes of latency.

Thread-safe: the caller's event loop admits, the engine thread reports which requests started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# The code a refusal carries: the caller answers "try again later" (HTTP 503 with Retry-After).
OVERLOADED = 503


class AdmissionQueue:
    def __init__(self, max_requests: int, max_tokens: int) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # request id -> prompt tokens, for requests not started
        self._tokens = 0
        self.num_refused = 0

    def admit(self, request_id: str, num_tokens: int) -> str | None:
        """Queue the request, or return why not (a message naming the limit and its config field). An id that
        waits already is the caller's error (AsyncEngine refuses ids in use before it admits): never overwritten,
        so each id's tokens are counted once and released once."""
        with self._lock:
            if request_id in self._pending:
                raise ValueError(f"request id {request_id!r} is queued already")
            refusal = self._refusal(num_tokens)
            if refusal is not None:
                self.num_refused += 1
                return refusal
            self._pending[request_id] = num_tokens
            self._tokens += num_tokens
            return None

    def _refusal(self, n: int) -> str | None:
        if len(self._pending) >= self.max_requests:
            return (f"The worker is overloaded: {len(self._pending)} requests wait to start, the most it queues "
                    f"(max_queued_requests={self.max_requests}). Retry later.")
        # An empty queue takes any prompt, so that one long prompt is never refused forever.
        if self._pending and self._tokens + n > self.max_tokens:
            return (f"The worker is overloaded: {self._tokens} prompt tokens wait to start and this request "
                    f"adds {n}, above max_queued_tokens={self.max_tokens}. Retry later.")
        return None

    def release(self, request_id: str) -> None:
        """The request started, finished, failed or was abandoned: it no longer waits."""
        with self._lock:
            self._tokens -= self._pending.pop(request_id, 0)

    def release_started(self, started: Callable[[str], bool]) -> None:
        """Called by the engine thread after a step: drop every pending request that has started."""
        with self._lock:
            done = [rid for rid in self._pending if started(rid)]
        for rid in done:
            self.release(rid)

    @property
    def queued(self) -> tuple[int, int]:
        """(requests, prompt tokens) waiting to start."""
        with self._lock:
            return len(self._pending), self._tokens
