"""What the OpenAI routes (completions, chat completions) share to answer: the SSE stream of an exchange's chunks in
OpenAI's framing.

A stream's status is 200 once its first event is out, so a failure after that (a worker's `error` finish, a
worker that died) is OpenAI's in-band error event, then `[DONE]`: OpenAI has no `error` finish reason.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from ingress.errors import IngressError, ServerError, finish_error, worker_failed
from ingress.lifecycle import Exchange
from ingress.openai.render.common import error_json
from ingress.sse import SSE_DONE, sse_data
from protocol import RequestOutput

logger = logging.getLogger(__name__)
Event = Callable[[int, RequestOutput], Awaitable[str]]


async def openai_events(cid: str, first_chunks: Sequence[RequestOutput], exchange: Exchange, event: Event,
                        choice_of: Sequence[int], tail: Callable[[], str] | None = None) -> AsyncGenerator[str, None]:
    """`event(choice, chunk)` for each choice's first chunk in order, then for the later chunks as they arrive
    (worker request j is choice `choice_of[j]`), then `tail()` (the usage chunk) when given, then [DONE]."""
    try:
        for i, chunk in enumerate(first_chunks):
            yield await event(i, chunk)
        async with contextlib.aclosing(exchange.later_chunks()) as later:
            async for j, chunk in later:
                if (error := finish_error(chunk.finish_reason)) is not None:
                    raise error
                yield await event(choice_of[j], chunk)
        if tail is not None:
            yield tail()
    except Exception as exc:  # CancelledError / GeneratorExit are BaseException: they pass through
        logger.warning("OpenAI answer failed mid-stream, id=%s", cid, exc_info=exc)
        # The error's own code (504 past the deadline, 503 for a lost worker), or 500 for anything unexpected.
        error = exc if isinstance(exc, IngressError) else ServerError(worker_failed(exc))
        yield sse_data(error_json(error))
    yield SSE_DONE
