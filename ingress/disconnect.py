"""Stop waiting on the worker as soon as the HTTP client goes away.

Ray Serve cancels a handler whose client disconnected, but plain uvicorn does not, and a streamed
response only notices a closed socket at its next write: a long prefill would then run to the end for
nobody. Listening for `http.disconnect` while the work runs makes the abort prompt under any server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from ingress.errors import ClientGone

T = TypeVar("T")


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it, wait until it unwound, raise ClientGone.

    Call only after the request body was read: from then on the next ASGI message is the disconnect.
    """
    work_task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({work_task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also when we are cancelled ourselves: never leave the work running unobserved.
        listener.cancel()
        if not work_task.done():
            work_task.cancel()
            # Let the work's `finally` blocks (which abort the worker request) run before going on.
            await asyncio.gather(work_task, return_exceptions=True)
    if work_task.cancelled():
        raise ClientGone()
    return work_task.result()


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        try:
            message = await receive()
        except Exception:
            # A server that cannot tell us is no reason to abort a live request: stop listening and
            # let the work end on its own (the server's own cancellation still applies).
            await asyncio.Event().wait()
        if message["type"] == "http.disconnect":
            return
