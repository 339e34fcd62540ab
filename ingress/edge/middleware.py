"""The checks that come before a route runs, for every route at once: the API key, then the body's size and
its arrival time.

A pure ASGI middleware rather than a FastAPI dependency, because all must answer before the body is
parsed: an unauthenticated client gets its 401 without the server reading its body, and a body over
`max_request_bytes` is refused on its Content-Length, or, when it comes without one (chunked) or lies, as
soon as the bytes read pass the limit, before any JSON parser sees them. Errors take the route's own shape.

Slow clients: Serve's proxy hands a request to this replica as soon as its headers are in, and the request then
holds one of the replica's `max_ongoing_requests` slots while its body trickles in. So the whole body must
arrive within `body_timeout_s` (408 and the connection closed), and a method that takes no body (GET, HEAD,
OPTIONS, DELETE) is answered without reading one: a body declared on it is refused at once (400).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingress.edge.auth import ADMIN_PATHS, check_admin, check_authorization
from ingress.errors import BodyTimeout, IngressError, InvalidRequest, JSONAnswer, PayloadTooLarge
from ingress.settings import IngressSettings

ErrorBody = Callable[[IngressError], dict[str, Any]]
# Reachable without a key: only the health probe (load balancers, Serve's own checks). The API's description
# (/docs, /openapi.json) needs a key too: it tells an outsider what this server runs; send the key to read it.
OPEN_PATHS = frozenset({"/health"})
TOO_LARGE = ("The request body is {size} bytes; this server accepts at most {limit} (config field "
             "`max_request_bytes`).")
TOO_LARGE_STREAMED = ("The request body exceeds {limit} bytes, the most this server accepts (config field "
                      "`max_request_bytes`).")
TOO_SLOW = ("The request body did not arrive within {limit:g} s (config field `body_timeout_s`).")
NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
NO_BODY = "{method} {path} takes no request body."


class GuardMiddleware:
    """401 without a valid key (when keys are set), 413 for a body over the limit; else the app, with the
    body already read (and replayed to it)."""

    def __init__(self, app: ASGIApp, settings: IngressSettings, error_body: Callable[[str], ErrorBody]) -> None:
        self.app = app
        self.settings = settings
        self.error_body = error_body  # route path -> that API's error body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        try:
            if path in ADMIN_PATHS:
                check_admin(_header(scope, b"authorization"), self.settings)
            elif path not in OPEN_PATHS:
                check_authorization(_header(scope, b"authorization"), self.settings.api_keys)
            if scope["method"] in NO_BODY_METHODS:
                _refuse_body(scope, path)
                await self.app(scope, receive, send)  # nothing to read: the app sees the server's own receive
                return
            body = await self._read_body_in_time(scope, receive)
        except IngressError as exc:
            answer = JSONAnswer(self.error_body(path)(exc), status_code=exc.status, headers=exc.headers())
            await answer(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body_in_time(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.settings.body_timeout_s
        try:
            return await asyncio.wait_for(self._read_body(scope, receive), limit)
        except TimeoutError:
            raise BodyTimeout(TOO_SLOW.format(limit=limit)) from None

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.settings.max_request_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(TOO_LARGE.format(size=int(declared), limit=limit))
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # the client left: the app's own disconnect handling takes it from here
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(TOO_LARGE_STREAMED.format(limit=limit))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _refuse_body(scope: Scope, path: str) -> None:
    """400 for a body declared on a method that takes none; it is never read."""
    length = _header(scope, b"content-length")
    if _header(scope, b"transfer-encoding") is not None or (length is not None and length.strip() not in ("", "0")):
        raise InvalidRequest(NO_BODY.format(method=scope["method"], path=path))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that first hands out the body read, then the server's messages (the disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def route_path(scope: Scope) -> str:
    """The path routes are matched on."""
    # Under Serve the app is mounted at a route prefix (root_path); routes are matched without it.
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] or "/" if root and path.startswith(root) else path


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
