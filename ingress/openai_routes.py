"""OpenAI-compatible routes over the same Backend as /generate: what evaluation tools (lm-eval's
`local-completions`) and OpenAI clients speak.

- POST /v1/completions (openai_completions.py): legacy completions; `echo` + `logprobs` returns the
  prompt's logprobs (exact, from the engine's scoring path) and then the completion's.
- POST /v1/chat/completions (openai_chat.py): chat completions over the tokenizer's chat template.
- POST /v1/score (openai_score.py): SGLang's label-token scoring of query+item pairs.
- GET /v1/models; POST /tokenize, POST /detokenize, GET /tokenizer_info (vLLM's shapes: lm-eval's remote
  tokenizer uses them).
Every error has OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: 400 for a value the
rules reject, 404 for another model's name, 422 for a body of the wrong shape, 5xx only when no worker
could answer. As on /generate, a client that goes away aborts its requests.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ingress.backend import Backend
from ingress.errors import InvalidRequest, JSONAnswer
from ingress.lifecycle import Lifecycle
from ingress.openai_chat import ChatRoutes
from ingress.openai_chat_schemas import ChatResponse
from ingress.openai_completions import CompletionRoutes
from ingress.openai_format import error_json
from ingress.openai_schemas import (
    CompletionResponse,
    DetokenizeBody,
    DetokenizeResponse,
    ModelList,
    OpenAIErrorBody,
    TokenizeBody,
    TokenizeResponse,
)
from ingress.openai_score import ScoreResponse, ScoreRoutes
from ingress.openai_validation import check_model
from ingress.rules import TOKEN_OUT_OF_RANGE
from workers.protocol import TokenizerInfo


class OpenAIRoute(APIRoute):
    """A route whose malformed bodies get OpenAI's error shape (422) instead of FastAPI's `detail` list."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = exc.errors()
                locs = [tuple(e.get("loc", ()))[1:] for e in errors]  # without the leading "body"
                message = "; ".join(f"{'.'.join(map(str, loc)) or 'body'}: {e.get('msg', 'invalid')}"
                                    for loc, e in zip(locs, errors, strict=True))
                # `param` names the body's field; a JSON syntax error's location is a character offset.
                param = locs[0][0] if locs and locs[0] and isinstance(locs[0][0], str) else None
                error = InvalidRequest(message or "Invalid request body.", param=param, status=422)
                return JSONAnswer(error_json(error), status_code=error.status)

        return route


class TokenizerRoutes:
    """GET /v1/models, POST /tokenize, POST /detokenize, GET /tokenizer_info."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def models(self, request: Request) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            card = {"id": info.model_name, "object": "model", "created": int(time.time()), "owned_by": "rayscore",
                    "max_model_len": info.max_model_len}
            return {"object": "list", "data": [card]}

        return await self._run(request, answer)

    async def tokenize(self, body: TokenizeBody, request: Request) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            check_model(body.model, info)
            tokens = await self._backend.tokenize(body.prompt, body.add_special_tokens)
            return {"tokens": tokens, "count": len(tokens), "max_model_len": info.max_model_len}

        return await self._run(request, answer)

    async def detokenize(self, body: DetokenizeBody, request: Request) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            check_model(body.model, info)
            bad = next((t for t in body.tokens if not 0 <= t < info.vocab_size), None)
            if bad is not None:
                raise InvalidRequest(TOKEN_OUT_OF_RANGE.format(token_id=bad, vocab_size=info.vocab_size), param="tokens")
            return {"prompt": await self._backend.detokenize(body.tokens)}

        return await self._run(request, answer)

    async def tokenizer_info(self, request: Request) -> Response:
        async def answer() -> dict[str, Any]:
            return asdict(await self._backend.tokenizer_info())

        return await self._run(request, answer)

    async def _run(self, request: Request, answer: Callable[[], Awaitable[dict[str, Any]]]) -> Response:
        # No worker stream: the lifecycle still maps errors, answers 503 when no worker can, and stops on
        # a disconnect.
        async def work(_batch: object) -> Response:
            return JSONAnswer(await answer())

        return await self._lifecycle.run(request, work)


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": OpenAIErrorBody, "description": "A value the rules reject; `param` names the field."},
    422: {"model": OpenAIErrorBody, "description": "A body of the wrong shape."},
    503: {"model": OpenAIErrorBody, "description": "No worker could answer."},
}
# Routes that run the model: also 404 for another model's name, and 500 when the engine fails first.
_MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": OpenAIErrorBody, "description": "`model` is not the served model."},
    500: {"model": OpenAIErrorBody, "description": "The engine failed before the answer started."},
}


def openai_router(backend: Backend) -> APIRouter:
    """The OpenAI-compatible routes over `backend`, for `app.include_router`."""
    lifecycle = Lifecycle(backend, error_json)
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
    router.add_api_route("/v1/models", routes.models, methods=["GET"], response_model=None,
                         summary="The served model", responses={200: {"model": ModelList}, 503: _ERRORS[503]})
    router.add_api_route("/tokenize", routes.tokenize, methods=["POST"], response_model=None,
                         summary="Text -> token ids, as prompts are tokenized",
                         responses={200: {"model": TokenizeResponse}, **_ERRORS})
    router.add_api_route("/detokenize", routes.detokenize, methods=["POST"], response_model=None,
                         summary="Token ids -> text", responses={200: {"model": DetokenizeResponse}, **_ERRORS})
    router.add_api_route("/tokenizer_info", routes.tokenizer_info, methods=["GET"], response_model=None,
                         summary="Special tokens and chat template (lm-eval's remote tokenizer)",
                         responses={200: {"model": TokenizerInfo}, 503: _ERRORS[503]})
    return router
