"""Several requests' deltas as one stream of messages: what `EngineWorker.generate_many` sends back.

A streamed HTTP request with several prompts is one streaming worker call, not one per prompt (each call costs a
generator on both sides of the handle and a message per delta). Its requests run side by side; the deltas that are
ready together go out as one message, each tagged with its request's position in the call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from protocol import RequestOutput

# One message of a many-call: (position of the request in the call, its delta), in the order they came.
Tagged = list[tuple[int, RequestOutput]]
_ENDED = None  # a request's stream ended (after its final chunk)


async def merged(streams: Sequence[AsyncGenerator[RequestOutput, None]]) -> AsyncIterator[Tagged]:
    """The deltas of `streams`, each read in a task of its own, as messages of what is ready at the same time; ends
    when every stream has ended. A stream that raises ends the whole: the error is raised here, and closing this
    iterator early (the call cancelled: the client left) closes every stream, which aborts its request."""
    ready: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    ready.put_nowait((i, chunk))
        except Exception as exc:  # noqa: BLE001  # raised by the reader, which ends the call with it
            ready.put_nowait(exc)
        ready.put_nowait(_ENDED)

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    live = len(tasks)
    try:
        while live:
            items = [await ready.get()]
            # One turn of the loop: the other requests' deltas of the same engine step arrive in the same message.
            await asyncio.sleep(0)
            while not ready.empty():
                items.append(ready.get_nowait())
            message: Tagged = []
            for item in items:
                if item is _ENDED:
                    live -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    message.append(item)
            if message:
                yield message
    finally:
        for task in tasks:  # cancelled, failed or done: no request is left running unread
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
