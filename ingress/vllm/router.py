"""vLLM's token-in route, POST /inference/v1/generate and /inference/v1/abort_requests (routes.py), with OpenAI's
error body as vLLM's server writes it."""

from __future__ import annotations

from fastapi import APIRouter

from ingress.backend import Backend
from ingress.edge.openai_route import MODEL_ERRORS, OpenAIRoute
from ingress.edge.openapi import error_responses
from ingress.lifecycle import Lifecycle
from ingress.openai.schemas.common import OpenAIErrorBody
from ingress.vllm.routes import TokenRoutes
from ingress.vllm.schemas import TokenGenerateResponse


def token_router(backend: Backend, lifecycle: Lifecycle) -> APIRouter:
    """vLLM's token routes over `backend`, for `app.include_router`; `lifecycle` writes OpenAI's error body."""
    tokens = TokenRoutes(backend, lifecycle)
    router = APIRouter(route_class=OpenAIRoute, tags=["OpenAI-compatible"])
    router.add_api_route(
        "/inference/v1/generate", tokens.generate, methods=["POST"], response_model=None,
        summary="vLLM's token-in / token-out route (output_mode tokens): prompt logprobs, per-row candidate ids",
        responses={200: {"model": TokenGenerateResponse, "content": {"text/event-stream": {}},
                         "description": "One JSON answer, or with `stream` vLLM's chunks ending in [DONE]."},
                   **MODEL_ERRORS})
    router.add_api_route(
        "/inference/v1/abort_requests", tokens.abort_requests, methods=["POST"], response_model=None,
        summary="Abort /inference/v1/generate requests by request_id (vLLM's)",
        responses={200: {"description": "Aborted (an empty body)."},
                   **error_responses(OpenAIErrorBody, body=True)})
    return router
