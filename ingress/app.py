"""The HTTP routes, over an injected Backend: a fake one in unit tests, Ray Serve handles in deployment."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from ingress.backend import Backend
from ingress.disconnect import ClientGone, until_disconnect
from ingress.errors import (
    WORKER_ENDED_EARLY,
    JSONAnswer,
    RequestError,
    finish_error,
    invalid_request,
    unavailable,
    worker_failed,
)
from ingress.openai_routes import openai_router
from ingress.request_id import RequestIdMiddleware
from ingress.request_record import RecordingBackend, RequestRecord
from ingress.responses import chunk_json
from ingress.schemas import ErrorBody, GenerateBody, GenerateResponse, HealthBody
from ingress.streaming import SSEResponse, sse_events
from ingress.validation import to_request, validate
from workers.protocol import GenerateChunk, merge_chunks

logger = logging.getLogger(__name__)

# nginx's "client closed request": written to a socket nobody reads, but it keeps access logs honest.
CLIENT_CLOSED_REQUEST = 499


class GenerateRoutes:
    """Route handlers bound to one backend; the FastAPI app is only their wiring."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def generate(self, body: GenerateBody, request: Request) -> Response:
        try:
            info = await self._backend.model_info()
        except Exception as exc:
            logger.warning("model_info failed", exc_info=exc)
            return unavailable(worker_failed(exc))
        try:
            validate(body, info)
        except RequestError as exc:
            return invalid_request(exc.message)

        req = to_request(body)
        stream = self._backend.stream(req)
        handed_off = False  # once the SSE response owns the stream, it closes it
        try:
            # The first chunk decides the status even of a streamed request, since no byte is out yet:
            # a worker's rejection (FinishInfo code 400) is a 400, a failure a 5xx.
            first = await until_disconnect(request.receive, anext(stream, None))
            if first is None:
                return unavailable(WORKER_ENDED_EARLY)
            if (answer := finish_error(first.finish_reason)) is not None:
                return answer
            if body.stream:
                handed_off = True
                return SSEResponse(sse_events(first, stream), on_close=stream.aclose)
            chunks = [first]
            if not first.finished:
                chunks += await until_disconnect(request.receive, _until_finished(stream))
            if not chunks[-1].finished:
                return unavailable(WORKER_ENDED_EARLY)
            whole = merge_chunks(chunks)
            return finish_error(whole.finish_reason) or JSONAnswer(chunk_json(whole))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as exc:
            logger.warning("worker failed before the answer started, rid=%s", req.rid, exc_info=exc)
            return unavailable(worker_failed(exc))
        finally:
            # Aborts the worker request unless its final chunk was seen (the Backend.stream contract).
            # Also runs when Ray Serve cancels this handler because the client went away.
            if not handed_off:
                await stream.aclose()

    async def health(self) -> Response:
        if await self._backend.ready():
            return JSONAnswer({"status": "ok"})
        return JSONAnswer({"status": "unavailable"}, status_code=503)


async def _until_finished(stream: AsyncGenerator[GenerateChunk, None]) -> list[GenerateChunk]:
    chunks: list[GenerateChunk] = []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.finished:
            break  # a stream that does not end after its final chunk must not hold the answer
    return chunks


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    # FastAPI's own 422 body, written by a JSON encoder that survives a client's NaN (FastAPI's would 500).
    assert isinstance(exc, RequestValidationError)
    return JSONAnswer({"detail": jsonable_encoder(exc.errors())}, status_code=422)


def build_fastapi_app(backend: Backend, on_request: Callable[[RequestRecord], None] | None = None) -> FastAPI:
    """The ingress app over `backend`; OpenAPI at /docs and /openapi.json. Every request gets an id and an
    access-log line (request_id.py); `on_request` sees each finished request's record (the metrics)."""
    backend = RecordingBackend(backend)
    app = FastAPI(
        title="rayscore",
        summary="Exact input-token scoring and generation for a causal LM.",
        version="0.1.0",
    )
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_middleware(RequestIdMiddleware, on_finish=on_request)
    routes = GenerateRoutes(backend)
    app.add_api_route(
        "/generate",
        routes.generate,
        methods=["POST"],
        summary="Generate from, or score, a prompt",
        response_model=None,
        responses={
            200: {
                "model": GenerateResponse,
                "description": "One JSON answer, or with `stream` server-sent events of deltas ending in [DONE].",
                "content": {"text/event-stream": {}},
            },
            400: {"model": ErrorBody, "description": "The request breaks a rule of the contract."},
            500: {"model": ErrorBody, "description": "The engine failed before the answer started."},
            503: {"model": ErrorBody, "description": "No worker could answer."},
        },
    )
    app.add_api_route(
        "/health",
        routes.health,
        methods=["GET"],
        summary="Ready when the ingress and at least one worker answer",
        response_model=None,
        responses={200: {"model": HealthBody}, 503: {"model": HealthBody}},
    )
    # /v1/completions, /v1/models, /tokenize, /detokenize, /tokenizer_info (openai_routes.py).
    app.include_router(openai_router(backend))
    return app
