"""OpenAI-compatible routes over the same Backend as /generate: what evaluation tools (lm-eval's
`local-completions`) and OpenAI clients speak.

- POST /v1/completions (completions.py): legacy completions; `echo` + `logprobs` returns the
  prompt's logprobs (exact, from the engine's scoring path) and then the completion's.
- POST /v1/chat/completions (chat.py): chat completions over the tokenizer's chat template.
- POST /v1/score (score.py): SGLang's label-token scoring of query+item pairs.
- GET /v1/models; POST /tokenize, POST /detokenize, GET /tokenizer_info (vLLM's shapes: lm-eval's remote
  tokenizer uses them).
Every error has OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: 400 for a value the
rules reject, 404 for another model's name, 422 for a body of the wrong shape, 5xx only when no worker
could answer. As on /generate, a client that goes away aborts its requests.
"""

from __future__ import annotations

from fastapi import APIRouter

from ingress.backend import Backend
from ingress.edge.openai_route import MODEL_ERRORS, OpenAIRoute
from ingress.edge.openapi import error_responses
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
from protocol import TokenizerInfo


def openai_router(backend: Backend, settings: IngressSettings | None = None,
                  retries: RetryCounter | None = None) -> APIRouter:
    """The OpenAI-compatible routes over `backend`, for `app.include_router`."""
    lifecycle = Lifecycle(backend, error_json, settings, retries)
    completions = CompletionRoutes(backend, lifecycle)
    chat = ChatRoutes(backend, lifecycle)
    score = ScoreRoutes(backend, lifecycle)
    routes = TokenizerRoutes(backend, lifecycle)
    router = APIRouter(route_class=OpenAIRoute, tags=["OpenAI-compatible"])
    streamed = "One JSON answer, or with `stream` OpenAI chunks ending in [DONE]."
    router.add_api_route(
        "/v1/completions", completions.completions, methods=["POST"], response_model=None,
        summary="OpenAI legacy completions; echo + logprobs scores the prompt",
        responses={200: {"model": CompletionResponse, "content": {"text/event-stream": {}}, "description": streamed},
                   **MODEL_ERRORS})
    router.add_api_route(
        "/v1/chat/completions", chat.chat, methods=["POST"], response_model=None,
        summary="OpenAI chat completions over the tokenizer's chat template, with logprobs",
        responses={200: {"model": ChatResponse, "content": {"text/event-stream": {}}, "description": streamed},
                   **MODEL_ERRORS})
    router.add_api_route(
        "/v1/score", score.score, methods=["POST"], response_model=None,
        summary="SGLang's scoring: the label tokens' next-token probabilities after each query+item",
        responses={200: {"model": ScoreResponse}, **MODEL_ERRORS})
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
