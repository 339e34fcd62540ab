"""The front door's guard: checks on a request's headers made in front of Ray Serve's own request handling.

Serve reads some headers itself before any rayscore code runs (X-Request-ID, `serve_multiplexed_model_id`, the
session and tracing headers, `x-request-timeout-seconds`) and decodes them as UTF-8: a byte that is not is its
plain-text 500, on the Python proxy and on a replica's direct ingress behind HAProxy alike. Serve's Python proxy
also accepts about a megabyte of headers, and answers its own `/-/routes` to anyone. This middleware sits outside
all of that: Serve wraps its proxy's app and each ingress replica's HTTP server in the middlewares that the function
named by RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH returns (deploy/launch.py sets it to `middlewares` below).

Per request, before Serve sees it: the request gets exactly one X-Request-ID (the client's when it is short and plain,
else a made one in its place), so Serve's own echo of it is the only one in the answer and the ingress, seeing the
same id, adds none; a request target (path and query) over `max_url_bytes` is a 414; headers over
`max_header_bytes` in all are a 431; a header value that is not UTF-8 is a 400 naming the header; `/-/` routes other
than the health probe need an API key when keys are set (the proxy runs in no app: it sees the environment's keys,
$RAYSCORE_API_KEYS, and the launcher's SHA-256 digests of the app config's keys, $RAYSCORE_PROXY_KEY_SHA256).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ingress.app import error_shape
from ingress.edge.auth import check_authorization, resolve_keys
from ingress.edge.request_id import HEADER as REQUEST_ID
from ingress.edge.request_id import new_id, usable_id
from ingress.errors import IngressError, InvalidRequest, JSONAnswer

# What the launcher passes (the proxy runs in no app, so its settings come from the environment).
MAX_HEADER_BYTES_ENV = "RAYSCORE_MAX_HEADER_BYTES"
MAX_URL_BYTES_ENV = "RAYSCORE_MAX_URL_BYTES"
DEFAULT_MAX_URL_BYTES = 8 * 1024
# 16 KiB: HAProxy's default buffer (tune.bufsize), a common bound on a request's headers; behind HAProxy the launcher
# sizes the buffer to hold these limits (deploy/front_door.py).
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
NOT_UTF8 = "The header {name} is not valid UTF-8; this server takes header values as UTF-8 text."
TOO_LARGE = ("The request's headers are {size} bytes; this server accepts at most {limit} (config field "
             "`max_header_bytes`).")
URL_TOO_LONG = ("The request's target (path and query) is {size} bytes; this server accepts at most {limit} (config "
                "field `max_url_bytes`).")
# Serve's own routes; the health probe stays open (load balancers and HAProxy's checks send no key).
SERVE_PREFIX = "/-/"
OPEN_SERVE_PATHS = frozenset({"/-/healthz"})


def header_violation(headers: list[tuple[bytes, bytes]], limit: int,
                     sent: list[tuple[bytes, bytes]] | None = None) -> IngressError | None:
    """The first thing wrong with a request's headers: their size as `sent` (431), then a value that is not UTF-8
    (400)."""
    size = sum(len(k) + len(v) + 4 for k, v in (headers if sent is None else sent))  # "name: value\r\n"
    if size > limit:
        return InvalidRequest(TOO_LARGE.format(size=size, limit=limit), status=431)
    for key, value in headers:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            name = key.decode("latin-1")
            return InvalidRequest(NOT_UTF8.format(name=name), param=name)
    return None


# The app config's API keys, as SHA-256 hex digests (deploy/front_door.py sets it): the proxy runs in no app, so the
# launcher hands it the config's keys, hashed, to keep the keys themselves out of every process's environment.
KEY_HASHES_ENV = "RAYSCORE_PROXY_KEY_SHA256"


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class FrontDoorGuard:
    def __init__(self, app: ASGIApp, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 api_keys: tuple[str, ...] = (), key_hashes: tuple[str, ...] = (),
                 max_url_bytes: int = DEFAULT_MAX_URL_BYTES) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.max_url_bytes = max_url_bytes
        # Every key as its digest: the check compares digests, each in constant time (check_authorization).
        self.key_hashes = tuple(dict.fromkeys((*map(key_sha256, api_keys), *key_hashes)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = list(scope.get("headers", ()))
        rid, headers = one_request_id(sent)
        scope = {**scope, "headers": headers}
        error = url_violation(scope, self.max_url_bytes) or header_violation(headers, self.max_header_bytes, sent)
        path = scope.get("path", "")
        if error is None and path.startswith(SERVE_PREFIX) and path not in OPEN_SERVE_PATHS:
            auth = next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), None)
            try:
                check_authorization(_hashed(auth), self.key_hashes)
            except IngressError as exc:
                error = exc
        if error is None:
            await self.app(scope, receive, send)
            return
        answer = JSONAnswer(error_shape(path)(error), status_code=error.status,
                            headers={**error.headers(), "X-Request-ID": rid})
        await answer(scope, receive, send)


def url_violation(scope: Scope, limit: int) -> IngressError | None:
    """A request target over `limit` bytes (414); the message gives sizes only, never the path."""
    raw = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
    query = scope.get("query_string") or b""
    size = len(raw) + (len(query) + 1 if query else 0)
    return InvalidRequest(URL_TOO_LONG.format(size=size, limit=limit), status=414) if size > limit else None


def one_request_id(headers: list[tuple[bytes, bytes]]) -> tuple[str, list[tuple[bytes, bytes]]]:
    """The request's id and its headers with exactly one X-Request-ID holding it: the client's first when usable,
    else a made one (an id with spaces or beyond ASCII is replaced, never passed on beside another)."""
    given = [v for k, v in headers if k.lower() == REQUEST_ID.encode()]
    rid = (usable_id(given[0]) if given else None) or new_id()
    return rid, [(k, v) for k, v in headers if k.lower() != REQUEST_ID.encode()] + [(REQUEST_ID.encode(), rid.encode())]


def _hashed(authorization: str | None) -> str | None:
    """The Authorization value with its bearer token replaced by the token's digest (so it compares to key_hashes)."""
    scheme, _, token = (authorization or "").partition(" ")
    return f"{scheme} {key_sha256(token.strip())}" if token.strip() else authorization


def middlewares(environ: Mapping[str, str] | None = None) -> list[Middleware]:
    """Serve's HTTP proxy callback (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=ingress.edge.front_door:middlewares),
    run in each proxy and each direct-ingress replica."""
    env = os.environ if environ is None else environ
    limit = int(env.get(MAX_HEADER_BYTES_ENV, DEFAULT_MAX_HEADER_BYTES))
    hashes = tuple(h for h in env.get(KEY_HASHES_ENV, "").split(",") if h)
    return [Middleware(FrontDoorGuard, max_header_bytes=limit, api_keys=resolve_keys((), env), key_hashes=hashes,
                       max_url_bytes=int(env.get(MAX_URL_BYTES_ENV, DEFAULT_MAX_URL_BYTES)))]
