"""The app factory: every API's routes over an injected Backend (a fake one in unit tests, Ray Serve handles in
deployment), with the edge's middleware and the error shape of each path."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ingress.adapters.routes import adapters_router
from ingress.backend import Backend
from ingress.classify.router import classify_router
from ingress.edge.middleware import GuardMiddleware, route_path
from ingress.edge.request_id import RequestIdMiddleware
from ingress.edge.request_record import RecordingBackend, RequestRecord
from ingress.errors import InvalidRequest, JSONAnswer, NotFound, bounded_errors
from ingress.generate.render import error_json
from ingress.generate.routes import generate_router
from ingress.generate.schemas import HealthBody
from ingress.lifecycle import ErrorBody, Lifecycle
from ingress.openai.render.common import error_json as openai_error_json
from ingress.openai.router import openai_router
from ingress.retry import RetryCounter
from ingress.settings import IngressSettings
from ingress.sglang.router import sglang_dialect
from ingress.vllm.rl_routes import rl_router
from ingress.vllm.router import token_router
from ingress.weights.control import control_router
from ingress.weights.routes import weights_router


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    # FastAPI's own 422 body, written by a JSON encoder that survives a client's NaN (FastAPI's would 500).
    assert isinstance(exc, RequestValidationError)
    return JSONAnswer({"detail": jsonable_encoder(bounded_errors(list(exc.errors())))}, status_code=422)


# Routes whose errors have the /generate contract's body (docs/api.md); every other route speaks OpenAI's.
CONTRACT_PATHS = frozenset({"/generate"})


def error_shape(path: str) -> ErrorBody:
    """The error body of the API `path` belongs to (for checks that run before routing: edge/middleware.py)."""
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
    gets an id and an access-log line (edge/request_id.py); `on_request` sees each finished request's record (the
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
    # /generate: the contract's bodies (generate/routes.py) and SGLang's (sglang/router.py), one path, told apart by
    # the body's shape; both answer in the contract's error body.
    contract = Lifecycle(backend, error_json, settings, retries)
    app.include_router(generate_router(backend, contract, others=(sglang_dialect(backend, contract),)))

    async def health() -> Response:
        if not await backend.ready():
            return JSONAnswer({"status": "unavailable"}, status_code=503)
        # Paused is alive (200: a load balancer keeps the server), but a client or operator must see why nothing
        # is generated: SGLang's pause holds every request until /continue_generation or `pause_timeout_s`.
        if (mode := await backend.paused()) is not None:
            return JSONAnswer({"status": "paused", "pause_mode": mode})
        return JSONAnswer({"status": "ok"})

    app.add_api_route("/health", health, methods=["GET"], response_model=None,
                      summary="Ready when the ingress and at least one worker answer; says when generation is paused",
                      responses={200: {"model": HealthBody}, 503: {"model": HealthBody}})
    # /v1/completions, /v1/chat/completions, /v1/score, /v1/models, /tokenize, /detokenize, /tokenizer_info
    # (openai/router.py).
    app.include_router(openai_router(backend, settings, retries))
    # /classify, /pooling (classify/router.py) and vLLM's token route /inference/v1/generate,
    # /inference/v1/abort_requests (vllm/router.py): OpenAI's error body, as the routes above.
    openai_shaped = Lifecycle(backend, openai_error_json, settings, retries)
    app.include_router(classify_router(backend, openai_shaped))
    app.include_router(token_router(backend, openai_shaped))
    # /update_weights_from_disk, /flush_cache, /model_info (weights/routes.py).
    app.include_router(weights_router(backend))
    # /v1/load_lora_adapter, /v1/unload_lora_adapter, /load_lora_adapter, /unload_lora_adapter (adapters/routes.py).
    app.include_router(adapters_router(backend))
    # SGLang's control routes: /pause_generation, /continue_generation, /abort_request, /get_model_info,
    # /get_server_info, /health_generate (weights/control.py).
    app.include_router(control_router(backend))
    # vLLM's RL routes: /pause, /resume, /is_paused, /abort_requests (vllm/rl_routes.py).
    app.include_router(rl_router(backend))
    return app
