"""The ingress's one error hierarchy: what went wrong, with its HTTP status; each API writes its own body.

- InvalidRequest (400, and a worker's other 4xx codes): the client sent something the rules reject, found by
  a validator or by the worker (FinishReason code 400: a text prompt too long once tokenized, ...). The
  client must change the request. NotFound (404): it names something this server does not have.
- Unauthorized (401): no valid API key. PayloadTooLarge (413): the body is over `max_request_bytes`.
  BodyTimeout (408): the body did not arrive within `body_timeout_s`.
- ServerError (500): the engine failed. Unavailable (503): no worker could answer (none ready, or it died
  before a byte was sent); retrying later may succeed once the worker is replaced. Its kinds: WorkerLost
  (the worker died or vanished: the lifecycle runs the request again, retry.py) and Overloaded (a full
  queue: answered at once, with `Retry-After`). DeadlineExceeded (504): over `request_timeout_s`.
- ClientGone (499): the client went away first; nobody reads the answer.
The lifecycle (lifecycle.py) raises them and turns any other exception into Unavailable. Once a stream has
started the status is 200 for good: errors are then in-band, in each API's own event.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from starlette.responses import JSONResponse

from protocol import FinishReason
from rulebook.rules import Violation

# nginx's "client closed request": written to a socket nobody reads, but it keeps access logs honest.
CLIENT_CLOSED_REQUEST = 499

# Why a request ended without a worker's final chunk (a 503 before any byte, an `error` event after).
WORKER_ENDED_EARLY = "The worker ended the request's stream without a final chunk."


def worker_failed(exc: BaseException) -> str:
    # The exception's text (a remote traceback, for Ray errors) goes to the log, not to the client.
    return f"The worker failed while serving this request ({type(exc).__name__})."


class IngressError(Exception):
    """A request the ingress answers with an error. `param` names the offending field where one does."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"  # the error body's `type`, shared by SGLang's and OpenAI's shapes

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status  # type: ignore[misc]  # an instance may refine its class's code (4xx, 5xx)

    def headers(self) -> dict[str, str]:
        """HTTP headers the answer carries besides its body."""
        return {}


class InvalidRequest(IngressError):
    status = 400
    type = "invalid_request_error"


def enforce(broken: Violation | None, param: str | None = None) -> None:
    """A rule of the rulebook the request broke, as a 400 with the rule's message; `param` names the body's
    field where the API names one (default: the rule's own field, if any)."""
    if broken is not None:
        raise InvalidRequest(broken.message, param=param or broken.param)


class NotFound(IngressError):
    status = 404
    type = "not_found_error"


class Unauthorized(IngressError):
    status = 401
    type = "authentication_error"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class PayloadTooLarge(InvalidRequest):
    status = 413


class BodyTimeout(InvalidRequest):
    """The body did not arrive within `body_timeout_s`: a slow client must not hold an ingress slot for good."""

    status = 408
    type = "timeout_error"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}  # the rest of a half-sent body is not worth reading


class ServerError(IngressError):
    status = 500


class Unavailable(ServerError):
    status = 503


class WorkerLost(Unavailable):
    """The worker serving the request died or vanished (Ray's actor errors): the request can run elsewhere. Answered
    (503) only once the retries are spent: its replacement is on the way, so the client may come back."""

    retry_after_s: ClassVar[int] = 1

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class Overloaded(Unavailable):
    """A queue is full (a worker's bounded queue, or Serve's max_queued_requests): come back shortly."""

    retry_after_s: ClassVar[int] = 1

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class DeadlineExceeded(IngressError):
    status = 504
    type = "timeout_error"


class ClientGone(IngressError):
    """The client disconnected before the answer was complete; the work was cancelled."""

    status = CLIENT_CLOSED_REQUEST
    type = "client_closed_request"

    def __init__(self) -> None:
        super().__init__("The client closed the request.")


def finish_error(finish: FinishReason | None) -> IngressError | None:
    """The error a worker's `error` finish stands for; None for any other finish.

    The worker's code picks the class: a 4xx is the client's fault and keeps its code and message (the
    worker rejects a request for its prompt, hence `param`); 503 is a full queue (Overloaded); anything else
    (500, or no code) is the server's.
    """
    if finish is None or finish.type != "error":
        return None
    message = finish.message or "The worker failed to serve this request."
    code = finish.code
    if code is not None and 400 <= code < 500:
        return InvalidRequest(message, param="prompt", status=code)
    if code == Overloaded.status:  # the worker's bounded queue refused it at once
        return Overloaded(message)
    if code == DeadlineExceeded.status:  # the ingress's own deadline, as an in-band error of a stream
        return DeadlineExceeded(message)
    return ServerError(message, status=code if code is not None and 500 <= code < 600 else 500)


def located(errors: Any, *where: Any) -> list[dict[str, Any]]:
    """Pydantic's errors of a part of the body, located as FastAPI locates a body's (`body`, field, ...)."""
    return [{**e, "loc": (*where, *e["loc"])} for e in errors]


class JSONAnswer(JSONResponse):
    """JSONResponse that lets non-finite floats through as Python's json writes them (-Infinity, NaN).

    A raw logit or logprob can be -inf; Starlette's default (allow_nan=False) would turn such an answer,
    or a 422 that echoes a client's `NaN`, into a 500.
    """

    def render(self, content: Any) -> bytes:
        return json_text(content).encode("utf-8")


def json_text(content: Any) -> str:
    """JSON text that UTF-8 can always carry. A client may send a lone surrogate ("\\ud800" is valid JSON, and its
    rid or model name may be echoed back); UTF-8 has no bytes for it, so such an answer is written with \\u
    escapes (ASCII) instead of failing as a 500. allow_nan: a raw logit can be -inf."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=True, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(content, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    return text


# A body's validation errors as reported: a 50,000-item list of bad values must not be echoed back 50,000 times
# (an 11.8 MB answer and seconds of the event loop). The first few, each message and echoed input cut short, then
# one entry that counts the rest.
MAX_REPORTED_ERRORS = 5
MAX_ERROR_TEXT = 200


def _short(value: Any) -> Any:
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "..."


def bounded_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's error list, at most MAX_REPORTED_ERRORS entries (+1 counting the rest) of bounded size."""
    out = []
    for e in errors[:MAX_REPORTED_ERRORS]:
        item = {"loc": list(e.get("loc", ()))[:8], "msg": _short(str(e.get("msg", "invalid"))),
                "type": _short(str(e.get("type", "value_error")))}
        if "input" in e:
            item["input"] = _short(e["input"])
        out.append(item)
    if len(errors) > MAX_REPORTED_ERRORS:
        out.append({"loc": ["body"], "msg": f"and {len(errors) - MAX_REPORTED_ERRORS} more errors",
                    "type": "too_many_errors"})
    return out
