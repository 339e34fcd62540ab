"""OpenAI-compatible routes over the same Backend as /generate: what evaluation tools (lm-eval's
`local-completions`) and OpenAI clients speak.

- POST /v1/completions (completions.py): legacy completions; `echo` + `logprobs` returns the
  prompt's logprobs (exact, from the engine's scoring path) and then the completion's.
- POST /v1/chat/completions (chat.py): chat completions over the tokenizer's chat template.
- POST /v1/score (score.py): SGLang's label-token scoring of query+item pairs.
- POST /classify, POST /pooling (ingress/classify/): a classifier's scores, in vLLM's and SGLang's shapes.
- POST /inference/v1/generate, /inference/v1/abort_requests (ingress/vllm/): vLLM's token-in route.
- GET /v1/models; POST /tokenize, POST /detokenize, GET /tokenizer_info (vLLM's shapes: lm-eval's remote
  tokenizer uses them).
Every error has OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: 400 for a value the
rules reject, 404 for another model's name, 422 for a body of the wrong shape, 5xx only when no worker
could answer. As on /generate, a client that goes away aborts its requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ingress.backend import Backend
from ingress.classify.routes import ClassifyRoutes
from ingress.classify.schemas import ClassificationResponse, PoolingResponse, SGLangClassifyAnswer
from ingress.edge.openapi import error_responses
from ingress.errors import InvalidRequest, JSONAnswer, bounded_errors
from ingress.lifecycle import Lifecycle
from ingress.openai.chat import ChatRoutes
from ingress.openai.completions import CompletionRoutes
from ingress.openai.render.common import error_json
from ingress.openai.schemas.chat import ChatResponse
from ingress.openai.schemas.common import OpenAIErrorBody
from ingress.openai.schemas.completions import CompletionResponse
from ingress.openai.schemas.score import ScoreResponse
from ingress.openai.schemas.tokenizer import DetokenizeResponse, ModelList, TokenizeResponse
from ingress.openai.score import ScoreRoutes
from ingress.openai.tokenizer import TokenizerRoutes
from ingress.retry import RetryCounter
from ingress.settings import IngressSettings
from ingress.vllm.routes import TokenRoutes
from ingress.vllm.schemas import TokenGenerateResponse
from protocol import TokenizerInfo


class OpenAIRoute(APIRoute):
    """A route whose malformed bodies get OpenAI's error shape (422) instead of FastAPI's `detail` list."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = bounded_errors(list(exc.errors()))
                locs = [tuple(e.get("loc", ()))[1:] for e in errors]  # without the leading "body"
                message = "; ".join(f"{'.'.join(map(str, loc)) or 'body'}: {e.get('msg', 'invalid')}"
                                    for loc, e in zip(locs, errors, strict=True))
                # `param` names the body's field; a JSON syntax error's location is a character offset.
                param = locs[0][0] if locs and locs[0] and isinstance(locs[0][0], str) else None
                error = InvalidRequest(message or "Invalid request body.", param=param, status=422)
                return JSONAnswer(error_json(error), status_code=error.status)

        return route


# Routes that run the model: every error of a body, 404 for another model's name, 500 when the engine fails first.
_MODEL_ERRORS = error_responses(OpenAIErrorBody, body=True, generates=True, names_model=True)


def openai_router(backend: Backend, settings: IngressSettings | None = None,
                  retries: RetryCounter | None = None) -> APIRouter:
    """The OpenAI-compatible routes over `backend`, for `app.include_router`."""
    lifecycle = Lifecycle(backend, error_json, settings, retries)
    completions = CompletionRoutes(backend, lifecycle)
    chat = ChatRoutes(backend, lifecycle)
    score = ScoreRoutes(backend, lifecycle)
    routes = TokenizerRoutes(backend, lifecycle)
    classify = ClassifyRoutes(backend, lifecycle)
    tokens = TokenRoutes(backend, lifecycle)
    router = APIRouter(route_class=OpenAIRoute, tags=["OpenAI-compatible"])
    streamed = "One JSON answer, or with `stream` OpenAI chunks ending in [DONE]."
    router.add_api_route(
        "/v1/completions", completions.completions, methods=["POST"], response_model=None,
        summary="OpenAI legacy completions; echo + logprobs scores the prompt",
        responses={200: {"model": CompletionResponse, "content": {"text/event-stream": {}}, "description": streamed},
                   **_MODEL_ERRORS})
    router.add_api_route(
        "/v1/chat/completions", chat.chat, methods=["POST"], response_model=None,
        summary="OpenAI chat completions over the tokenizer's chat template, with logprobs",
        responses={200: {"model": ChatResponse, "content": {"text/event-stream": {}}, "description": streamed},
                   **_MODEL_ERRORS})
    router.add_api_route(
        "/v1/score", score.score, methods=["POST"], response_model=None,
        summary="SGLang's scoring: the label tokens' next-token probabilities after each query+item",
        responses={200: {"model": ScoreResponse}, **_MODEL_ERRORS})
    router.add_api_route(
        "/classify", classify.classify, methods=["POST"], response_model=None,
        summary="A classifier's scores: vLLM's body (`input`) or SGLang's (`text` / `input_ids`)",
        responses={200: {"model": ClassificationResponse | SGLangClassifyAnswer | list[SGLangClassifyAnswer]},
                   **_MODEL_ERRORS})
    router.add_api_route(
        "/pooling", classify.pooling, methods=["POST"], response_model=None,
        summary="vLLM's pooling of a classifier: each prompt's activated (or raw) scores",
        responses={200: {"model": PoolingResponse}, **_MODEL_ERRORS})
    router.add_api_route(
        "/inference/v1/generate", tokens.generate, methods=["POST"], response_model=None,
        summary="vLLM's token-in / token-out route (output_mode tokens): prompt logprobs, per-row candidate ids",
        responses={200: {"model": TokenGenerateResponse, "content": {"text/event-stream": {}},
                         "description": "One JSON answer, or with `stream` vLLM's chunks ending in [DONE]."},
                   **_MODEL_ERRORS})
    router.add_api_route(
        "/inference/v1/abort_requests", tokens.abort_requests, methods=["POST"], response_model=None,
        summary="Abort /inference/v1/generate requests by request_id (vLLM's)",
        responses={200: {"description": "Aborted (an empty body)."},
                   **error_responses(OpenAIErrorBody, body=True)})
    router.add_api_route("/v1/models", routes.models, methods=["GET"], response_model=None,
                         summary="The served model",
                         responses={200: {"model": ModelList}, **error_responses(OpenAIErrorBody)})
    router.add_api_route("/tokenize", routes.tokenize, methods=["POST"], response_model=None,
                         summary="Text -> token ids, as prompts are tokenized",
                         responses={200: {"model": TokenizeResponse},
                                    **error_responses(OpenAIErrorBody, body=True, names_model=True)})
    router.add_api_route("/detokenize", routes.detokenize, methods=["POST"], response_model=None,
                         summary="Token ids -> text",
                         responses={200: {"model": DetokenizeResponse},
                                    **error_responses(OpenAIErrorBody, body=True, names_model=True)})
    router.add_api_route("/tokenizer_info", routes.tokenizer_info, methods=["GET"], response_model=None,
                         summary="Special tokens and chat template (lm-eval's remote tokenizer)",
                         responses={200: {"model": TokenizerInfo}, **error_responses(OpenAIErrorBody)})
    return router
