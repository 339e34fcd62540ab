"""Error answers of the ingress, including a worker's error finish that arrives before any byte was sent.

- 400 `invalid_request_error`: the client sent something the contract rejects: found by validation.py,
  or by the worker (FinishInfo code 400: a text prompt too long once tokenized, a duplicate rid, ...).
  The client must change the request.
- 5xx `server_error`: no worker could answer (503: none ready, or it died before a byte was sent), or
  the engine failed (FinishInfo code 500). Retrying later may succeed once the worker is replaced.
Once a stream has started, the status is 200 for good: errors are then in-band (streaming.py).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from workers.protocol import FinishInfo

# Why a request ended without a worker's final chunk (a 503 before any byte, an `error` event after).
WORKER_ENDED_EARLY = "The worker ended the request's stream without a final chunk."


def worker_failed(exc: BaseException) -> str:
    # The exception's text (a remote traceback, for Ray errors) goes to the log, not to the client.
    return f"The worker failed while serving this request ({type(exc).__name__})."


class RequestError(Exception):
    """A request the contract rejects with HTTP 400; `message` is the contract's exact text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class JSONAnswer(JSONResponse):
    """JSONResponse that lets non-finite floats through as Python's json writes them (-Infinity, NaN).

    A raw logit or logprob can be -inf; Starlette's default (allow_nan=False) would turn such an answer,
    or a 422 that echoes a client's `NaN`, into a 500.
    """

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=True, separators=(",", ":")).encode("utf-8")


def error_body(message: str, *, type_: str, code: int) -> dict:
    return {"object": "error", "message": message, "type": type_, "code": code, "param": None}


def invalid_request(message: str, code: int = 400) -> JSONAnswer:
    return JSONAnswer(error_body(message, type_="invalid_request_error", code=code), status_code=code)


def server_error(message: str, code: int) -> JSONAnswer:
    return JSONAnswer(error_body(message, type_="server_error", code=code), status_code=code)


def unavailable(message: str) -> JSONAnswer:
    return server_error(message, 503)


def finish_error(finish: FinishInfo | None) -> JSONAnswer | None:
    """The HTTP answer for a worker's `error` finish seen before any byte went out; None otherwise.

    The worker's FinishInfo.code picks the class: a 4xx is the client's fault and keeps its code and
    message; anything else (500, or no code at all) is the server's.
    """
    if finish is None or finish.type != "error":
        return None
    message = finish.message or "The worker failed to serve this request."
    code = finish.code
    if code is not None and 400 <= code < 500:
        return invalid_request(message, code)
    return server_error(message, code if code is not None and 500 <= code < 600 else 500)
