"""The streamed answer: worker chunks -> SSE events, and a response that always aborts what it abandons."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ingress.disconnect import ClientGone, until_disconnect
from ingress.errors import WORKER_ENDED_EARLY, worker_failed
from ingress.responses import SSE_DONE, SSE_HEADERS, error_chunk, sse_event
from workers.protocol import GenerateChunk

logger = logging.getLogger(__name__)


async def sse_events(first: GenerateChunk, rest: AsyncIterator[GenerateChunk]) -> AsyncGenerator[str, None]:
    """One event per worker chunk, from an already-received first chunk, then `[DONE]`.

    Once bytes are out the status is 200 for good, so a worker that fails or ends early is reported
    in-band: one last event with finish_reason `error`. The stream always ends; it never hangs.
    """
    yield sse_event(first)
    last = first
    message: str | None = None
    if not last.finished:
        try:
            async for chunk in rest:
                yield sse_event(chunk)
                last = chunk
                if chunk.finished:
                    break
        except Exception as exc:  # CancelledError / GeneratorExit are BaseException: they pass through
            logger.warning("worker failed mid-stream, rid=%s", last.rid, exc_info=exc)
            message = worker_failed(exc)
        else:
            if not last.finished:
                message = WORKER_ENDED_EARLY
    if message is not None:
        yield sse_event(error_chunk(last, message))
    yield SSE_DONE


class SSEResponse(StreamingResponse):
    """A text/event-stream response that closes its source whatever ends it.

    Starlette's StreamingResponse neither closes its iterator nor, under ASGI spec >= 2.4, listens for a
    disconnect: a client gone during a long prefill would be noticed only at the next write. Here the
    events race the disconnect, and `on_close` (the backend stream's aclose, which aborts the worker
    request) runs on completion, disconnect, cancellation and error alike.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[str, None], on_close: Callable[[], Awaitable[object]]) -> None:
        super().__init__(events, headers=SSE_HEADERS)
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(receive, self.stream_response(send))
        except (ClientGone, OSError):
            pass  # nobody left to answer; `finally` aborts the worker request
        finally:
            await self._events.aclose()
            await self._on_close()
