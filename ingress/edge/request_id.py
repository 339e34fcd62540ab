"""Request ids and the access log: an ASGI middleware around the whole ingress app.

Every HTTP request gets an id: the client's `X-Request-ID` when it sent a usable one, else a made one (behind
Serve's HTTP proxy, the proxy's, which is the same rule). The id is returned in the `X-Request-ID` header
of every answer, becomes the engine request id when the body names none (validation.to_request), and starts
one access-log line per request: id, method, route, status, tokens in/out, latency. Never the body, never a
header value other than the id. Answers of 5xx, and exceptions, are logged at WARNING/ERROR with the id; a
request whose client left before its answer started (its task cancelled) is logged and counted as 499.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingress.edge.request_record import RequestRecord, bind, unbind
from ingress.errors import CLIENT_CLOSED_REQUEST

# Serve's replica logger: its lines land in the replica's log file next to Serve's own, with Serve's request id.
access_log = logging.getLogger("ray.serve")

HEADER = "x-request-id"
# A client's id is taken as is when it is short and plain (it is echoed and logged); otherwise one is made.
_USABLE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def usable_id(value: bytes) -> str | None:
    """A client's X-Request-ID value as the id, or None when it is not short and plain (then one is made)."""
    rid = value.decode("latin-1")
    return rid if _USABLE_ID.fullmatch(rid) else None


def new_id() -> str:
    return uuid.uuid4().hex


def request_id_of(scope: Scope) -> str:
    for key, value in scope.get("headers", ()):
        if key.decode("latin-1").lower() == HEADER:
            return usable_id(value) or new_id()
    return new_id()


def _serve_echoes(rid: str) -> bool:
    """True when Serve's HTTP proxy already returns this id in its own X-Request-ID header."""
    context = sys.modules.get("ray.serve.context")  # never imported here: outside Serve there is no proxy
    if context is None:
        return False
    try:
        return context._get_serve_request_context().request_id == rid
    except Exception:  # Ray's private API moved: answer with our own header
        return False


class RequestIdMiddleware:
    """`on_finish(record)` is called once per HTTP request, after its last byte (the metrics hook)."""

    def __init__(self, app: ASGIApp, on_finish: Callable[[RequestRecord], None] | None = None) -> None:
        self.app = app
        self.on_finish = on_finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(request_id_of(scope), scope.get("method", ""))
        echo = not _serve_echoes(record.request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                if echo:
                    MutableHeaders(scope=message)[HEADER] = record.request_id
            elif message["type"] == "http.response.body":
                now = time.monotonic() - record.started
                if record.first_byte_s is None and (message.get("body") or not message.get("more_body")):
                    record.first_byte_s = now
                if not message.get("more_body"):
                    record.latency_s = now
            await send(message)

        token = bind(record)
        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # Serve cancels a request's task when its client disconnects (a /health probe that timed out): the
            # client's doing, not a server error, so no traceback and never a 500 that alerting would count.
            record.status = record.status or CLIENT_CLOSED_REQUEST
            raise
        except BaseException:
            record.status = record.status or 500
            access_log.exception("rayscore request failed: id=%s route=%s", record.request_id, _route(scope))
            raise
        finally:
            unbind(token)
            record.route = _route(scope)
            if record.latency_s is None:  # the client left, or the app raised, before the last byte
                record.latency_s = time.monotonic() - record.started
            _log_access(record)
            if self.on_finish is not None:
                try:
                    self.on_finish(record)
                except Exception:  # metrics must never fail an answer
                    access_log.exception("rayscore request metrics failed: id=%s", record.request_id)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def _log_access(r: RequestRecord) -> None:
    level = logging.WARNING if r.status >= 500 else logging.INFO
    access_log.log(level, "rayscore access id=%s method=%s route=%s status=%d kind=%s tokens_in=%d tokens_out=%d "
                   "finish=%s ttfb_ms=%.1f latency_ms=%.1f", r.request_id, r.method, r.route, r.status,
                   r.kind or "-", r.prompt_tokens, r.completion_tokens, r.finish_reason or "-",
                   1000 * (r.first_byte_s or 0.0), 1000 * (r.latency_s or 0.0))
