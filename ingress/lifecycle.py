"""One request's way through the ingress, the same for every route and every API.

    route ── Lifecycle.run(request, work) ── work(batch) ─┬─ batch.open(requests)   one worker stream per prompt
                                                          ├─ await batch.firsts()   first chunks: the HTTP status
                                                          ├─ await batch.collect()  whole answers, in order
                                                          └─ batch.stream(events)   or an SSE answer of rest()

`run` owns what every request needs: the client's disconnect cancels the work (ClientGone, 499), typed
errors (errors.py) become the API's error body, any other exception is a 503 (no worker could answer), and
every worker stream is closed at the end - which aborts the requests whose final chunk was not seen -
unless an SSE response took them over, and then it closes them when it ends.

A batch is N prompts -> N worker requests -> N answers in the prompts' order; a single prompt is the batch
of one. Each step is the one place for what belongs there: a check that must come before any work is
queued goes in `open`; what may happen while no byte has reached the client (the status can still change)
in `firsts` and `collect`; what concerns the whole HTTP exchange in `run`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.disconnect import until_disconnect
from ingress.errors import (
    WORKER_ENDED_EARLY,
    ClientGone,
    IngressError,
    JSONAnswer,
    Unavailable,
    finish_error,
    worker_failed,
)
from ingress.streaming import SSEResponse
from workers.protocol import GenerateChunk, GenerateRequest, error_chunk, merge_outputs

logger = logging.getLogger(__name__)
T = TypeVar("T")
Stream = AsyncGenerator[GenerateChunk, None]
ErrorBody = Callable[[IngressError], dict[str, Any]]


async def all_or_none(aws: Iterable[Awaitable[T]]) -> list[T]:
    """gather, but when one fails (or we are cancelled) the others are cancelled and have unwound before
    this returns: no stream is left running inside a task nobody awaits."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Batch:
    """The worker requests of one HTTP request: opened together, answered in order, closed together."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._streams: list[Stream] = []
        self._firsts: list[GenerateChunk] = []
        self.handed_off = False  # an SSE response owns the streams and closes them

    def open(self, requests: Sequence[GenerateRequest]) -> None:
        """Start one worker stream per request (nothing is sent before the first chunk is awaited)."""
        if self._streams:
            raise RuntimeError("a batch is opened once")
        self._streams = [self._backend.stream(req) for req in requests]

    async def firsts(self) -> list[GenerateChunk]:
        """Each stream's first chunk, in order. No byte is out yet, so these decide the HTTP status even of
        a streamed answer: a worker's rejection raises InvalidRequest, its failure a ServerError or
        Unavailable (the first failing stream's; the others are cancelled)."""
        self._firsts = await all_or_none(_first(stream) for stream in self._streams)
        return self._firsts

    async def collect(self) -> list[GenerateChunk]:
        """Each request's whole answer (its chunks merged), in order; raises as `firsts` does."""
        wholes = (_whole(first, stream) for first, stream in zip(self._firsts, self._streams, strict=True))
        return await all_or_none(wholes)

    async def rest(self) -> AsyncGenerator[tuple[int, GenerateChunk], None]:
        """The chunks after the first ones, as they arrive, each with its request's position.

        Ends when every stream has sent its final chunk, or right after a final `error` chunk. Once bytes
        are out the status is 200 for good, so a stream that fails (the worker died, or the stream ended
        without a final chunk) is reported as such a chunk, built on the last one it sent. Nothing is read
        after a stream's final chunk.
        """
        last = list(self._firsts)
        pending: dict[asyncio.Future[GenerateChunk | None], int] = {}

        def read_next(i: int) -> None:
            pending[asyncio.ensure_future(anext(self._streams[i], None))] = i

        for i, chunk in enumerate(last):
            if not chunk.finished:
                read_next(i)
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = pending.pop(task)
                    last[i] = chunk = _next_chunk(task, last[i])
                    yield i, chunk
                    if finish_error(chunk.finish_reason) is not None:
                        return
                    if not chunk.finished:
                        read_next(i)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def stream(self, events: AsyncGenerator[str, None]) -> SSEResponse:
        """Answer with server-sent `events`: the response takes over the streams and closes them when it ends."""
        self.handed_off = True
        return SSEResponse(events, on_close=self.aclose)

    async def aclose(self) -> None:
        # Aborts every worker request whose final chunk was not seen (the Backend.stream contract).
        for stream in self._streams:
            await stream.aclose()


async def _first(stream: Stream) -> GenerateChunk:
    chunk = await anext(stream, None)
    if chunk is None:
        raise Unavailable(WORKER_ENDED_EARLY)
    if (error := finish_error(chunk.finish_reason)) is not None:
        raise error
    return chunk


async def _whole(first: GenerateChunk, stream: Stream) -> GenerateChunk:
    chunks = [first]
    if not first.finished:
        async for chunk in stream:
            chunks.append(chunk)
            if chunk.finished:
                break  # a stream that does not end after its final chunk must not hold the answer
    whole = merge_outputs(chunks)
    if not whole.finished:
        raise Unavailable(WORKER_ENDED_EARLY)
    if (error := finish_error(whole.finish_reason)) is not None:
        raise error
    return whole


def _next_chunk(task: asyncio.Future[GenerateChunk | None], last: GenerateChunk) -> GenerateChunk:
    """A read's chunk, or the final `error` chunk that stands for a read that failed."""
    try:
        chunk = task.result()
    except Exception as exc:  # CancelledError is a BaseException: it passes through
        logger.warning("worker failed mid-stream, rid=%s", last.rid, exc_info=exc)
        return error_chunk(last.rid, worker_failed(exc), after=last)
    return error_chunk(last.rid, WORKER_ENDED_EARLY, after=last) if chunk is None else chunk


class Lifecycle:
    """Runs the requests of one API: its routes hand `run` their work; `error_body` writes its error shape."""

    def __init__(self, backend: Backend, error_body: ErrorBody) -> None:
        self._backend = backend
        self._error_body = error_body

    async def run(self, request: Request, work: Callable[[Batch], Awaitable[Response]]) -> Response:
        """`work(batch)`'s answer, or the error answer for what it raised; the batch closed unless streamed."""
        batch = Batch(self._backend)
        try:
            # The body was read before the handler ran: from here the next ASGI message is the disconnect.
            return await until_disconnect(request.receive, work(batch))
        except IngressError as exc:
            return self.answer(exc)
        except Exception as exc:
            logger.warning("worker failed before the answer started", exc_info=exc)
            return self.answer(Unavailable(worker_failed(exc)))
        finally:
            # Also runs when Ray Serve cancels this handler because the client went away.
            if not batch.handed_off:
                await batch.aclose()

    def answer(self, exc: IngressError) -> Response:
        if isinstance(exc, ClientGone):
            return Response(status_code=exc.status)  # nobody reads it, but access logs stay honest
        return JSONAnswer(self._error_body(exc), status_code=exc.status)
