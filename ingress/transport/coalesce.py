"""Concurrent short scoring requests sent to the workers as one call.

Each unary worker call costs the ingress and the worker a few CPU-milliseconds of Ray Serve's own machinery
(routing, the actor call, its metrics), as much as a 48-token request's share of a batched engine step costs on a
GPU. So once `max_in_flight` calls of such requests are out, the ones that arrive meanwhile wait here and go as one
call when one of those returns: under load a worker gets few large calls, and an idle server answers a lone request
at once, with no added wait.

Only scoring coalesces - max_tokens 0, or 1: the one token that vLLM's prompt_logprobs request and lm-eval's
loglikelihood request generate after the prompt, made in the prefill's step - at most `max_tokens` tokens in one call:
a coalesced call is cancelled only when every request in it is gone (its client left or its deadline passed), so
what a departed client leaves running is bounded to that. A longer generation or a larger batch goes alone. Each
request keeps its own admission group (fan_out.py): a refusal of one is that one's answer only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from protocol import GenerateRequest, RequestOutput

Call = Callable[[list[GenerateRequest]], Awaitable[list[RequestOutput]]]
# The most tokens a request that may coalesce generates: its prompt's step makes them, so it costs what scoring costs.
MAX_NEW_TOKENS = 1


@dataclass
class _Waiter:
    """One caller's requests, waiting for or riding in a coalesced call."""

    reqs: list[GenerateRequest]
    future: asyncio.Future[list[RequestOutput]]
    call: _Group | None = None  # set when sent
    gone: bool = False  # the caller stopped waiting (cancelled)


@dataclass
class _Group:
    waiters: list[_Waiter]
    task: asyncio.Task[None] | None = None


class Coalescer:
    """`answers(reqs)` as `call(reqs)` would answer, with concurrent small scoring calls merged (see module doc).

    `max_in_flight`: calls of small scoring requests out at once before such arrivals wait and coalesce (0: never
    coalesce); other calls go at once and hold no slot. `max_tokens`: most prompt tokens of one coalesced call (and
    of a request that may coalesce)."""

    def __init__(self, call: Call, max_in_flight: int, max_tokens: int) -> None:
        self._call = call
        self._max_in_flight = max_in_flight
        self._max_tokens = max_tokens
        self._in_flight = 0
        self._queue: deque[_Waiter] = deque()
        self.calls = 0  # worker calls made, and how many callers they served: what tests and the bench read
        self.coalesced = 0

    def resize(self, max_in_flight: int, max_tokens: int) -> None:
        """New bounds (the ingress's reconfigure); calls out now finish under the old ones."""
        self._max_in_flight, self._max_tokens = max_in_flight, max_tokens

    def _tokens(self, reqs: Sequence[GenerateRequest]) -> int | None:
        """Tokens (prompt and new) of `reqs` when every one may coalesce (scoring), else None."""
        total = 0
        for req in reqs:
            if req.params.max_tokens > MAX_NEW_TOKENS:
                return None
            total += _size(req)
        return total

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        tokens = self._tokens(reqs)
        if self._max_in_flight <= 0 or tokens is None or tokens > self._max_tokens:
            # Not a slot holder either: a long generation must never hold short scoring requests here (they
            # would wait for it in the ingress while the engine could batch them at once).
            self.calls += 1
            return await self._call(reqs)
        if self._in_flight < self._max_in_flight and not self._queue:
            return await self._alone(reqs)
        waiter = _Waiter(reqs, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        self._start()
        try:
            # shield: a caller cancelled here must not cancel the future that other waiters' results come through.
            return await asyncio.shield(waiter.future)
        except asyncio.CancelledError:
            self._leave(waiter)
            raise

    async def _alone(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        self._in_flight += 1
        self.calls += 1
        try:
            return await self._call(reqs)
        finally:
            self._in_flight -= 1
            self._start()

    def _leave(self, waiter: _Waiter) -> None:
        """The caller is gone: out of the queue if not sent yet; if sent, the call is cancelled (which aborts its
        requests in the worker) once no caller in it is left."""
        waiter.gone = True
        if waiter.call is None:
            with contextlib.suppress(ValueError):
                self._queue.remove(waiter)
            return
        group = waiter.call
        if all(w.gone for w in group.waiters) and group.task is not None:
            group.task.cancel()

    def _start(self) -> None:
        """Send what waits, one call per free slot, each up to max_tokens prompt tokens."""
        while self._queue and self._in_flight < self._max_in_flight:
            taken: list[_Waiter] = []
            tokens = 0
            while self._queue:
                nxt = self._queue[0]
                size = sum(_size(r) for r in nxt.reqs)
                if taken and tokens + size > self._max_tokens:
                    break
                taken.append(self._queue.popleft())
                tokens += size
            group = _Group(taken)
            for w in taken:
                w.call = group
            self._in_flight += 1
            self.calls += 1
            self.coalesced += len(taken)
            group.task = asyncio.ensure_future(self._send(group))

    async def _send(self, group: _Group) -> None:
        reqs = [r for w in group.waiters for r in w.reqs]
        try:
            answers = await self._call(reqs)
        except BaseException as exc:  # every caller gets the call's error (WorkerLost retries each on its own)
            for w in group.waiters:
                if w.gone or isinstance(exc, asyncio.CancelledError):
                    w.future.cancel()  # nobody reads a gone caller's future: no "exception never retrieved"
                elif not w.future.done():
                    w.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            at = 0
            for w in group.waiters:
                mine = answers[at:at + len(w.reqs)]
                at += len(w.reqs)
                if not w.future.done():
                    w.future.set_result(mine)
        finally:
            self._in_flight -= 1
            self._start()


def _size(req: GenerateRequest) -> int:
    return len(req.input_ids) + req.params.max_tokens
