"""One request's way through the ingress, the same for every route and every API.

    route ── Lifecycle.run(request, work) ── work(exchange) ─┬─ exchange.open(requests)   a stream per prompt,
                                                             │                            one call
                                                             ├─ await exchange.first_chunks()   the HTTP status
                                                             ├─ await exchange.collect()  whole answers, in order
                                                             ├─ exchange.stream(events)   or an SSE answer of
                                                             │                            later_chunks()
                                                             └─ await exchange.answers(requests)  not streamed:
                                                                                  one worker call, whole answers

`run` owns what every request needs: the client's disconnect cancels the work (ClientGone, 499), typed
errors (errors.py) become the API's error body, any other exception is a 503 (no worker could answer), and
every worker stream is closed at the end - which aborts the requests whose final chunk was not seen -
unless an SSE response took them over, and then it closes them when it ends. It also runs the work again,
on a fresh exchange, when a worker was lost before any byte went out (retry.py), and bounds the whole request
by `request_timeout_s`: 504 before any byte, a final `error` chunk (code 504) after (`Exchange.later_chunks`).

An Exchange is one HTTP request's worker requests: N prompts -> N worker requests -> N answers in the prompts'
order; a single prompt is the exchange of one. Each step is the one place for what belongs there: a check that
must come before any work is queued goes in `open` (the limits of limits.py are checked there, for every route);
what may happen while no byte has reached the client (the status can still change) in `first_chunks` and
`collect`; what concerns the whole HTTP exchange in `run`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.disconnect import until_disconnect
from ingress.errors import (
    WORKER_ENDED_EARLY,
    ClientGone,
    DeadlineExceeded,
    IngressError,
    JSONAnswer,
    Unavailable,
    WorkerLost,
    finish_error,
    worker_failed,
)
from ingress.fan_out import as_one_unit
from ingress.limits import check_fan_out, check_limits
from ingress.retry import RetryBudget, RetryCounter
from ingress.settings import IngressSettings
from ingress.sse import SSEResponse
from ingress.tasks import all_or_none
from protocol import AdapterRef, GenerateRequest, ModelInfo, RequestOutput, error_chunk, merge_outputs

logger = logging.getLogger(__name__)
Stream = AsyncGenerator[RequestOutput, None]
ErrorBody = Callable[[IngressError], dict[str, Any]]
DEADLINE = "The request exceeded its deadline of {seconds:g} s (config field `request_timeout_s`)."


class Exchange:
    """The worker requests of one HTTP request (its exchange with the workers): opened together, answered in order,
    closed together."""

    def __init__(self, backend: Backend, settings: IngressSettings | None = None,
                 deadline: float | None = None) -> None:
        self._backend = backend
        self._settings = settings or IngressSettings()
        self._deadline = deadline  # time.monotonic() by which the whole request must be answered
        self._streams: list[Stream] = []
        self._first_chunks: list[RequestOutput] = []
        self.handed_off = False  # an SSE response owns the streams and closes them
        # (name, PEFT folder) of the LoRA adapter every request of the exchange runs with, set by the route that
        # resolved it (ingress/adapters/select.py); None: the base model.
        self.adapter: tuple[str, str] | None = None

    def _adapted(self, requests: Sequence[GenerateRequest]) -> Sequence[GenerateRequest]:
        if self.adapter is None:
            return requests
        name, path = self.adapter
        return [dataclasses.replace(r, params=dataclasses.replace(r.params, adapter=AdapterRef(name, path)))
                for r in requests]

    @property
    def settings(self) -> IngressSettings:
        """The limits `open` and `answers` check (a route checks them first where a 400 must name its field)."""
        return self._settings

    def check_fan_out(self, n: int) -> None:
        """InvalidRequest (400 naming max_batch_items) when the HTTP request will make more than the limit's worker
        requests: for routes that know the count from the body, before their first worker call (tokenizing)."""
        check_fan_out(n, self._settings)

    def open(self, requests: Sequence[GenerateRequest], info: ModelInfo) -> None:
        """Check the requests against the limits and the worker's queue bounds (InvalidRequest), then open one
        stream per request, all of one admission group (fan_out.py) and read from one worker call (`Backend.streams`;
        a request with stop strings has its own); nothing is sent before the first chunk is awaited."""
        if self._streams:
            raise RuntimeError("an exchange is opened once")
        check_limits(requests, self._settings, info)
        self._streams = self._backend.streams(as_one_unit(self._adapted(requests), info))

    async def answers(self, requests: Sequence[GenerateRequest], info: ModelInfo) -> list[RequestOutput]:
        """`open` + `collect` in one worker call, for an answer that is not streamed: the same checks before any
        work, the same whole answers in order, the same errors (the first failed answer's, in order)."""
        if self._streams:
            raise RuntimeError("an exchange is opened once")
        check_limits(requests, self._settings, info)
        if not requests:  # e.g. a completion that only echoes its prompt: nothing to ask a worker
            return []
        answers = await self._backend.answers(as_one_unit(self._adapted(requests), info))
        for whole in answers:
            _check_whole(whole)
        return answers

    async def first_chunks(self) -> list[RequestOutput]:
        """Each stream's first chunk, in order. No byte is out yet, so these decide the HTTP status even of
        a streamed answer: a worker's rejection raises InvalidRequest, its failure a ServerError or
        Unavailable (the first failing stream's; the others are cancelled)."""
        self._first_chunks = await all_or_none(_first(stream) for stream in self._streams)
        return self._first_chunks

    async def collect(self) -> list[RequestOutput]:
        """Each request's whole answer (its chunks merged), in order; raises as `first_chunks` does."""
        answers = (_whole(first, stream) for first, stream in zip(self._first_chunks, self._streams, strict=True))
        return await all_or_none(answers)

    async def later_chunks(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """The chunks after the first ones, as they arrive, each with its request's position.

        Ends when every stream has sent its final chunk, or right after a final `error` chunk. Once bytes
        are out the status is 200 for good, so a stream that fails (the worker died, or the stream ended
        without a final chunk) or outlives the request's deadline is reported as such a chunk, built on the
        last one it sent. Nothing is read after a stream's final chunk.
        """
        last = list(self._first_chunks)
        pending: dict[asyncio.Future[RequestOutput | None], int] = {}

        def read_next(i: int) -> None:
            pending[asyncio.ensure_future(anext(self._streams[i], None))] = i

        for i, chunk in enumerate(last):
            if not chunk.finished:
                read_next(i)
        try:
            while pending:
                timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
                done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # past the deadline: the request ends here, in-band (its streams are then closed)
                    i = min(pending.values())
                    yield i, error_chunk(last[i].request_id, self.deadline_message(), DeadlineExceeded.status,
                                         after=last[i])
                    return
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

    def deadline_message(self) -> str:
        return DEADLINE.format(seconds=self._settings.request_timeout_s)


async def _first(stream: Stream) -> RequestOutput:
    chunk = await anext(stream, None)
    if chunk is None:
        raise Unavailable(WORKER_ENDED_EARLY)
    if (error := finish_error(chunk.finish_reason)) is not None:
        raise error
    return chunk


async def _whole(first: RequestOutput, stream: Stream) -> RequestOutput:
    chunks = [first]
    if not first.finished:
        async for chunk in stream:
            chunks.append(chunk)
            if chunk.finished:
                break  # a stream that does not end after its final chunk must not hold the answer
    return _check_whole(merge_outputs(chunks))


def _check_whole(whole: RequestOutput) -> RequestOutput:
    """A whole answer, or the error it ended with (a stream that ended without its final chunk: Unavailable)."""
    if not whole.finished:
        raise Unavailable(WORKER_ENDED_EARLY)
    if (error := finish_error(whole.finish_reason)) is not None:
        raise error
    return whole


def _next_chunk(task: asyncio.Future[RequestOutput | None], last: RequestOutput) -> RequestOutput:
    """A read's chunk, or the final `error` chunk that stands for a read that failed."""
    try:
        chunk = task.result()
    except Exception as exc:  # CancelledError is a BaseException: it passes through
        logger.warning("worker failed mid-stream, rid=%s", last.request_id, exc_info=exc)
        return error_chunk(last.request_id, worker_failed(exc), after=last)
    return error_chunk(last.request_id, WORKER_ENDED_EARLY, after=last) if chunk is None else chunk


class Lifecycle:
    """Runs the requests of one API: its routes hand `run` their work; `error_body` writes its error shape.
    `retries` counts the requests run again after a worker was lost."""

    def __init__(self, backend: Backend, error_body: ErrorBody, settings: IngressSettings | None = None,
                 retries: RetryCounter | None = None) -> None:
        self._backend = backend
        self._error_body = error_body
        self._settings = settings or IngressSettings()
        self._retries = retries or RetryCounter()

    async def run(self, request: Request, work: Callable[[Exchange], Awaitable[Response]]) -> Response:
        """`work(exchange)`'s answer, or the error answer for what it raised; the exchange closed unless streamed."""
        try:
            # The body was read before the handler ran: from here the next ASGI message is the disconnect.
            return await until_disconnect(request.receive, self._attempts(work))
        except IngressError as exc:
            return self.answer(exc)
        except Exception as exc:
            logger.warning("worker failed before the answer started", exc_info=exc)
            return self.answer(Unavailable(worker_failed(exc)))

    async def _attempts(self, work: Callable[[Exchange], Awaitable[Response]]) -> Response:
        """`work` on a fresh exchange, again while its worker was lost and the retry budget lasts, all within the
        request's deadline (then DeadlineExceeded, once the work has unwound and closed its exchange)."""
        timeout_s = self._settings.request_timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        task = asyncio.ensure_future(self._retried(work, deadline))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        finally:
            if not task.done():  # the deadline passed, or we were cancelled (the client left)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not done:
            raise DeadlineExceeded(DEADLINE.format(seconds=timeout_s))
        return task.result()

    async def _retried(self, work: Callable[[Exchange], Awaitable[Response]], deadline: float | None) -> Response:
        budget = RetryBudget(self._settings.retry_deadline_s)
        while True:
            exchange = Exchange(self._backend, self._settings, deadline)
            try:
                return await work(exchange)
            except WorkerLost as exc:
                if (wait := budget.next_wait()) is None:
                    raise
                self._retries()
                logger.info("worker lost before any byte was sent; attempt %d in %.2f s (%s)",
                            budget.attempts + 1, wait, exc.message)
            finally:
                # Also runs when Ray Serve cancels this handler because the client went away.
                if not exchange.handed_off:
                    await exchange.aclose()
            await asyncio.sleep(wait)

    def answer(self, exc: IngressError) -> Response:
        if isinstance(exc, ClientGone):
            return Response(status_code=exc.status)  # nobody reads it, but access logs stay honest
        return JSONAnswer(self._error_body(exc), status_code=exc.status, headers=exc.headers())
