"""POST /classify and POST /pooling (routes.py): a classifier's scores, in vLLM's and SGLang's shapes, with OpenAI's
error body."""

from __future__ import annotations

from fastapi import APIRouter

from ingress.backend import Backend
from ingress.classify.routes import ClassifyRoutes
from ingress.classify.schemas import ClassificationResponse, PoolingResponse, SGLangClassifyAnswer
from ingress.edge.openai_route import MODEL_ERRORS, OpenAIRoute
from ingress.lifecycle import Lifecycle


def classify_router(backend: Backend, lifecycle: Lifecycle) -> APIRouter:
    """The classifier's routes over `backend`, for `app.include_router`; `lifecycle` writes OpenAI's error body."""
    classify = ClassifyRoutes(backend, lifecycle)
    router = APIRouter(route_class=OpenAIRoute, tags=["OpenAI-compatible"])
    router.add_api_route(
        "/classify", classify.classify, methods=["POST"], response_model=None,
        summary="A classifier's scores: vLLM's body (`input`) or SGLang's (`text` / `input_ids`)",
        responses={200: {"model": ClassificationResponse | SGLangClassifyAnswer | list[SGLangClassifyAnswer]},
                   **MODEL_ERRORS})
    router.add_api_route(
        "/pooling", classify.pooling, methods=["POST"], response_model=None,
        summary="vLLM's pooling of a classifier: each prompt's activated (or raw) scores",
        responses={200: {"model": PoolingResponse}, **MODEL_ERRORS})
    return router
