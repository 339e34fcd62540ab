"""Server-sent events: their framing, and a response that always closes (aborts) what it abandons.

Each API writes its own event payloads (generate/render.py, openai/render/); this is the transport they share.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ingress.disconnect import until_disconnect
from ingress.errors import ClientGone, json_text

SSE_DONE = "data: [DONE]\n\n"
# Proxies (nginx) buffer responses unless told otherwise; an SSE stream must reach the client per event.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: dict[str, Any]) -> str:
    return f"data: {json_text(payload)}\n\n"


class SSEResponse(StreamingResponse):
    """A text/event-stream response that closes its source whatever ends it.

    Starlette's StreamingResponse neither closes its iterator nor, under ASGI spec >= 2.4, listens for a
    disconnect: a client gone during a long prefill would be noticed only at the next write. Here the
    events race the disconnect, and `on_close` (which closes the worker streams, aborting their requests)
    runs on completion, disconnect, cancellation and error alike.
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
            pass  # nobody left to answer; `finally` aborts the worker requests
        finally:
            await self._events.aclose()
            await self._on_close()
