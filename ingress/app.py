"""The HTTP routes, over an injected Backend: a fake one in unit tests, Ray Serve handles in deployment."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from ingress.backend import Backend
from ingress.errors import JSONAnswer
from ingress.lifecycle import Batch, Lifecycle
from ingress.openai_routes import openai_router
from ingress.request_id import RequestIdMiddleware
from ingress.request_record import RecordingBackend, RequestRecord
from ingress.responses import chunk_json, error_json, sse_event
from ingress.schemas import ErrorBody, GenerateBody, GenerateResponse, HealthBody
from ingress.streaming import SSE_DONE, sse_data
from ingress.validation import split_batch, to_request, validate, validate_batch
from workers.protocol import GenerateChunk


class GenerateRoutes:
    """Route handlers bound to one backend; the FastAPI app is only their wiring."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._lifecycle = Lifecycle(backend, error_json)

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


def build_fastapi_app(backend: Backend, on_request: Callable[[RequestRecord], None] | None = None) -> FastAPI:
    """The ingress app over `backend`; OpenAPI at /docs and /openapi.json. Every request gets an id and an
    access-log line (request_id.py); `on_request` sees each finished request's record (the metrics)."""
    backend = RecordingBackend(backend)
    app = FastAPI(title="rayscore", summary="Exact input-token scoring and generation for a causal LM.",
                  version="0.1.0")
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_middleware(RequestIdMiddleware, on_finish=on_request)
    routes = GenerateRoutes(backend)
    app.add_api_route(
        "/generate", routes.generate, methods=["POST"], response_model=None,
        summary="Generate from, or score, a prompt or a batch of prompts",
        responses={
            200: {"model": GenerateResponse | list[GenerateResponse],
                  "content": {"text/event-stream": {}},
                  "description": "One JSON answer (a list of them, in order, for a batch), or with `stream` "
                                 "server-sent events of deltas ending in [DONE] (a batch's events carry `index`)."},
            400: {"model": ErrorBody, "description": "The request breaks a rule of the contract."},
            500: {"model": ErrorBody, "description": "The engine failed before the answer started."},
            503: {"model": ErrorBody, "description": "No worker could answer."},
        })
    app.add_api_route("/health", routes.health, methods=["GET"], response_model=None,
                      summary="Ready when the ingress and at least one worker answer",
                      responses={200: {"model": HealthBody}, 503: {"model": HealthBody}})
    # /v1/completions, /v1/models, /tokenize, /detokenize, /tokenizer_info (openai_routes.py).
    app.include_router(openai_router(backend))
    return app
