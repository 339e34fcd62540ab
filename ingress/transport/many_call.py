"""The streams of several worker requests, read from one streaming worker call (`EngineWorker.generate_many`).

A streamed HTTP request with several prompts is one admitted unit and one worker call. `Exchange` reads one stream per
request (its first chunk decides the HTTP status, then the deltas as they come), so one reader of the call puts each
tagged delta in its request's queue and each request's stream reads its own queue:

    worker call ── reader task ─┬─ queue 0 ── member(0): its deltas, through the output processor (ingress/output/)
                                ├─ queue 1 ── member(1)
                                └─ ...

The call is closed as a whole: a member that ends before its final chunk (closed, cancelled: the client left, the
batch failed or ran out of time) cancels the call, which aborts every request of it in the worker. An error of the
call (a worker that died, a queue that is full) is raised by every member still waiting, as `HandleBackend.stream`
raises it (ray_calls.translated). The reader starts when a member is first read: nothing is sent before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Sequence
from typing import Any

from ingress.output.processor import OutputProcessor, Tokenizer
from ingress.transport.ray_calls import cancel, translated
from protocol import GenerateRequest, RequestOutput

# (position in the call, delta) pairs, as workers/many.py sends them.
Message = list[tuple[int, RequestOutput]]
_END = object()  # the call ended: a member that saw no final chunk ends without it (Exchange: WORKER_ENDED_EARLY)


class ManyCall:
    """One worker call for `reqs`; `member(i)` is request i's stream."""

    def __init__(self, reqs: Sequence[GenerateRequest], call: Callable[[list[GenerateRequest]], Any],
                 tokenizer: Tokenizer, seen: Callable[[RequestOutput], None] = lambda chunk: None) -> None:
        """`call`: the worker call's response (an async iterable of messages, with `cancel()`); `tokenizer`: the
        output processor's; `seen`: each delta as it arrives (the model-info version it carries)."""
        self._reqs = list(reqs)
        self._call, self._tokenizer, self._seen = call, tokenizer, seen
        self._queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in self._reqs]
        self._finished = [False] * len(self._reqs)
        self._reader: asyncio.Task[None] | None = None

    def members(self) -> list[AsyncGenerator[RequestOutput, None]]:
        return [self.member(i) for i in range(len(self._reqs))]

    async def member(self, i: int) -> AsyncGenerator[RequestOutput, None]:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        output = OutputProcessor(self._reqs[i].params, self._tokenizer)
        finished = False
        try:
            while True:
                item = await self._queues[i].get()
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                chunk: RequestOutput = await output.feed(item)
                finished = chunk.finished
                yield chunk
                if finished:
                    return
        finally:
            if not finished:
                await self.aclose()

    async def aclose(self) -> None:
        """Cancel the call (every request of it not finished is aborted in the worker) and wait for the reader."""
        reader = self._reader
        if reader is not None and not reader.done():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self) -> None:
        response = None
        try:
            # Serve's router may refuse the call right here (BackPressureError), not only on the first read.
            response = self._call(self._reqs)
            messages: AsyncIterable[Message] = response
            async for message in messages:
                for i, chunk in message:
                    self._seen(chunk)
                    self._put(i, chunk)
        except Exception as exc:
            error = translated(exc)
            if error is not exc:
                error.__cause__ = exc
            for i, queue in enumerate(self._queues):
                if not self._finished[i]:
                    queue.put_nowait(error)
        finally:
            for queue in self._queues:
                queue.put_nowait(_END)
            # Reached when cancelled too (a member ended early): the worker aborts what is not finished.
            if response is not None and not all(self._finished):
                cancel(response)

    def _put(self, i: int, chunk: RequestOutput) -> None:
        self._finished[i] = self._finished[i] or chunk.finished
        self._queues[i].put_nowait(chunk)
