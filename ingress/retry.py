"""When a request whose worker failed runs again, and how long it waits first.

The lifecycle runs a request again only when its worker was lost (WorkerLost: the replica died or vanished)
and no byte of the answer has reached the client: a scoring request is a pure function of its input, and a
generation nobody has seen any of may as well start over. Serve routes the new attempt to a live replica, or
holds it until the replacement is up. Attempts go on, with exponential backoff, until `retry_deadline_s`
after the first failure; the request's own deadline (`request_timeout_s`) still bounds everything.

Not retried: a full queue (Overloaded: answered 503 + Retry-After at once, so the client, which knows its
own patience, decides), a 4xx, an engine error (500: the same input would fail again), and anything once
bytes are out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The first wait, and the most any wait lasts: Serve notices a dead replica within about a second, and a
# replacement on this machine loads its model in 5-20 s.
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0


@dataclass
class RetryBudget:
    """The retry state of one request: `next_wait()` is how long to wait before the next attempt, or None
    when the deadline has passed (then the failure is the answer)."""

    deadline_s: float
    clock: Callable[[], float] = time.monotonic
    attempts: int = 0
    _until: float | None = field(default=None, repr=False)

    def next_wait(self) -> float | None:
        now = self.clock()
        if self._until is None:
            self._until = now + self.deadline_s
        left = self._until - now
        if left <= 0:
            return None
        wait = min(FIRST_BACKOFF_S * 2**self.attempts, MAX_BACKOFF_S, left)
        self.attempts += 1
        return wait


class RetryCounter:
    """Retries since start, for stats; `on_retry` also feeds a metric where the deployment gives one."""

    def __init__(self, on_retry: Callable[[], None] | None = None) -> None:
        self.total = 0
        self._on_retry = on_retry

    def __call__(self) -> None:
        self.total += 1
        if self._on_retry is not None:
            self._on_retry()
