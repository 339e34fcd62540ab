"""A bounded queue in front of the engine: requests that were accepted but have not started (no engine step
has computed any of them yet) and their prompt tokens. One request more than the bounds is refused at once,
before it is queued, so that a flood costs the worker a counter, not memory or minutes of latency.

Groups: the worker requests of one HTTP request (a /generate batch, /v1/score's items) may name a
group and how many of their first tokens an earlier member of it has too (`shared`). While such a member waits
here, a newcomer of its group is counted without them: the shared query of 40 labels is counted once, as the
prefix cache computes it once. And a queue that holds only the newcomer's own group takes it whatever its
tokens, as an empty queue takes any prompt: the members of a request that fits an idle worker (the ingress
refuses, with 400, one that never can) are never refused for each other.

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
        self._pending: dict[str, int] = {}  # request id -> the prompt tokens it is counted for, until it starts
        self._group_of: dict[str, str] = {}  # request id -> its group, for pending requests that name one
        self._group_size: dict[str, int] = {}  # group -> its pending requests
        self._tokens = 0
        self.num_refused = 0

    def resize(self, max_requests: int, max_tokens: int) -> None:
        """New bounds (a worker's user_config): requests already queued stay; the next admission is judged on them."""
        with self._lock:
            self.max_requests, self.max_tokens = max_requests, max_tokens

    def admit(self, request_id: str, num_tokens: int, group: str | None = None, shared: int = 0) -> str | None:
        """Queue the request, or return why not (a message naming the limit and its config field). An id that
        waits already is the caller's error (AsyncEngine refuses ids in use before it admits): never overwritten,
        so each id's tokens are counted once and released once. `shared`: of its first tokens, how many an
        earlier request of `group` has too (module docstring)."""
        with self._lock:
            if request_id in self._pending:
                raise ValueError(f"request id {request_id!r} is queued already")
            in_group = group is not None and self._group_size.get(group, 0) > 0
            n = num_tokens - min(max(shared, 0), num_tokens) if in_group else num_tokens
            refusal = self._refusal(n, group)
            if refusal is not None:
                self.num_refused += 1
                return refusal
            self._pending[request_id] = n
            self._tokens += n
            if group is not None:
                self._group_of[request_id] = group
                self._group_size[group] = self._group_size.get(group, 0) + 1
            return None

    def _refusal(self, n: int, group: str | None) -> str | None:
        if len(self._pending) >= self.max_requests:
            return (f"The worker is overloaded: {len(self._pending)} requests wait to start, the most it queues "
                    f"(max_queued_requests={self.max_requests}). Retry later.")
        # A queue holding nothing but the request's own group takes any prompt (an empty queue, in particular), so
        # that one long prompt, or one request's members, are never refused forever.
        own = self._group_size.get(group, 0) if group is not None else 0
        if len(self._pending) > own and self._tokens + n > self.max_tokens:
            return (f"The worker is overloaded: {self._tokens} prompt tokens wait to start and this request "
                    f"adds {n}, above max_queued_tokens={self.max_tokens}. Retry later.")
        return None

    def release(self, request_id: str) -> None:
        """The request started, finished, failed or was abandoned: it no longer waits."""
        with self._lock:
            self._tokens -= self._pending.pop(request_id, 0)
            group = self._group_of.pop(request_id, None)
            if group is not None:
                left = self._group_size[group] - 1
                if left:
                    self._group_size[group] = left
                else:
                    del self._group_size[group]

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
