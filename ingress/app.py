"""The HTTP routes, over an injected Backend: a fake one in unit tests, Ray Serve handles in deployment."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ingress.backend import Backend
from ingress.errors import InvalidRequest, JSONAnswer, NotFound
from ingress.lifecycle import Batch, ErrorBody, Lifecycle
from ingress.middleware import GuardMiddleware, route_path
from ingress.openai_format import error_json as openai_error_json
from ingress.openai_routes import openai_router
from ingress.openapi import error_responses
from ingress.request_id import RequestIdMiddleware
from ingress.request_record import RecordingBackend, RequestRecord
from ingress.responses import chunk_json, error_json, sse_event
from ingress.retry import RetryCounter
from ingress.schemas import ErrorBody as ErrorModel
from ingress.schemas import GenerateBody, GenerateResponse, HealthBody
from ingress.settings import IngressSettings
from ingress.streaming import SSE_DONE, sse_data
from ingress.validation import split_batch, to_request, validate, validate_batch
from workers.protocol import GenerateChunk


class GenerateRoutes:
    """Route handlers bound to one backend; the FastAPI app is only their wiring."""

    def __init__(self, backend: Backend, settings: IngressSettings, retries: RetryCounter) -> None:
        self._backend = backend
        self._lifecycle = Lifecycle(backend, error_json, settings, retries)

    async def generate(self, body: GenerateBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda batch: self._generate(body, batch))

    async def _generate(self, body: GenerateBody, batch: Batch) -> Response:
        """One prompt (the batch of one), or SGLang's batch: a list of prompts, one worker request each, so the
        router spreads them and the prefix cache shares what they have in common."""
        info = await self._backend.model_info()
        items = split_batch(body)
        if items is None:
            validate(body, info)
        else:
            validate_batch(items, info)
        batch.open([to_request(item) for item in items or [body]])
        firsts = await batch.firsts()
        if body.stream:
            return batch.stream(_events(firsts, batch, indexed=items is not None))
        wholes = await batch.collect()
        if items is None:
            return JSONAnswer(chunk_json(wholes[0]))
        return JSONAnswer([chunk_json(whole) for whole in wholes])

    async def health(self) -> Response:
        if await self._backend.ready():
            return JSONAnswer({"status": "ok"})
        return JSONAnswer({"status": "unavailable"}, status_code=503)


async def _events(firsts: list[GenerateChunk], batch: Batch, indexed: bool) -> AsyncGenerator[str, None]:
    """One event per worker chunk, then one `[DONE]`; a failure once bytes are out is the final `error` event.
    A batch's events name their item (`index`): the first chunks in order, then as they arrive."""

    def event(i: int, chunk: GenerateChunk) -> str:
        return sse_data({**chunk_json(chunk), "index": i}) if indexed else sse_event(chunk)

    for i, chunk in enumerate(firsts):
        yield event(i, chunk)
    async with contextlib.aclosing(batch.rest()) as rest:
        async for i, chunk in rest:
            yield event(i, chunk)
    yield SSE_DONE


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    # FastAPI's own 422 body, written by a JSON encoder that survives a client's NaN (FastAPI's would 500).
    assert isinstance(exc, RequestValidationError)
    return JSONAnswer({"detail": jsonable_encoder(exc.errors())}, status_code=422)


# Routes whose errors have the contract's body (docs/generate-contract.md); every other route speaks OpenAI's.
CONTRACT_PATHS = frozenset({"/generate"})


def error_shape(path: str) -> ErrorBody:
    """The error body of the API `path` belongs to (for checks that run before routing: middleware.py)."""
    return error_json if path in CONTRACT_PATHS else openai_error_json


async def _on_http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's own HTTP errors (a body it cannot parse: 400; no such route: 404; a wrong method: 405) in the
    error shape of the API the path belongs to, instead of its `{"detail": ...}`."""
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else "The request was rejected."
    error = NotFound(message) if exc.status_code == 404 else InvalidRequest(message, status=exc.status_code)
    return JSONAnswer(error_shape(route_path(request.scope))(error), status_code=exc.status_code, headers=exc.headers)


def build_fastapi_app(backend: Backend, settings: IngressSettings | None = None, retries: RetryCounter | None = None,
                      on_request: Callable[[RequestRecord], None] | None = None) -> FastAPI:
    """The ingress app over `backend`, enforcing `settings`; OpenAPI at /docs and /openapi.json. Every request
    gets an id and an access-log line (request_id.py); `on_request` sees each finished request's record (the
    metrics); `retries` counts requests run again after their worker was lost."""
    settings = settings or IngressSettings()
    retries = retries or RetryCounter()
    backend = RecordingBackend(backend)
    app = FastAPI(title="rayscore", summary="Exact input-token scoring and generation for a causal LM.",
                  version="0.1.0")
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    # The last added runs first: a request gets its id (and access-log line) before the key and size checks.
    app.add_middleware(GuardMiddleware, settings=settings, error_body=error_shape)
    app.add_middleware(RequestIdMiddleware, on_finish=on_request)
    routes = GenerateRoutes(backend, settings, retries)
    app.add_api_route(
        "/generate", routes.generate, methods=["POST"], response_model=None,
        summary="Generate from, or score, a prompt or a batch of prompts",
        responses={
            200: {"model": GenerateResponse | list[GenerateResponse],
                  "content": {"text/event-stream": {}},
                  "description": "One JSON answer (a list of them, in order, for a batch), or with `stream` "
                                 "server-sent events of deltas ending in [DONE] (a batch's events carry `index`)."},
            **error_responses(ErrorModel, body=True, generates=True, own_422=False),
        })
    app.add_api_route("/health", routes.health, methods=["GET"], response_model=None,
                      summary="Ready when the ingress and at least one worker answer",
                      responses={200: {"model": HealthBody}, 503: {"model": HealthBody}})
    # /v1/completions, /v1/models, /tokenize, /detokenize, /tokenizer_info (openai_routes.py).
    app.include_router(openai_router(backend, settings, retries))
    return app
