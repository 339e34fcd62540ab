"""OpenAI-compatible routes over the same Backend as /generate: what evaluation tools (lm-eval's
`local-completions`) and OpenAI clients speak.

- POST /v1/completions (openai_completions.py): legacy completions; `echo` + `logprobs` returns the
  prompt's logprobs (exact, from the engine's scoring path) and then the completion's.
- GET /v1/models; POST /tokenize, POST /detokenize, GET /tokenizer_info (vLLM's shapes: lm-eval's remote
  tokenizer uses them).
Every error has OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: 400 for a value the
rules reject, 404 for another model's name, 422 for a body of the wrong shape, 5xx only when no worker
could answer. As on /generate, a client that goes away aborts its requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ingress.backend import Backend
from ingress.errors import JSONAnswer, worker_failed
from ingress.openai_completions import CompletionRoutes
from ingress.openai_schemas import (
    CompletionResponse,
    DetokenizeBody,
    DetokenizeResponse,
    ModelList,
    OpenAIErrorBody,
    TokenizeBody,
    TokenizeResponse,
)
from ingress.openai_validation import (
    OpenAIRequestError,
    check_model,
    openai_error,
    server_error,
)
from workers.protocol import TokenizerInfo

logger = logging.getLogger(__name__)


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
                return openai_error(message or "Invalid request body.", 422, type_="invalid_request_error",
                                    param=param)

        return route


class TokenizerRoutes:
    """GET /v1/models, POST /tokenize, POST /detokenize, GET /tokenizer_info."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def models(self) -> Response:
        return await self._answer(self._models())

    async def _models(self) -> dict[str, Any]:
        info = await self._backend.model_info()
        card = {"id": info.model_name, "object": "model", "created": int(time.time()), "owned_by": "rayscore",
                "max_model_len": info.max_model_len}
        return {"object": "list", "data": [card]}

    async def tokenize(self, body: TokenizeBody) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            check_model(body.model, info)
            tokens = await self._backend.tokenize(body.prompt, body.add_special_tokens)
            return {"tokens": tokens, "count": len(tokens), "max_model_len": info.max_model_len}

        return await self._answer(answer())

    async def detokenize(self, body: DetokenizeBody) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            check_model(body.model, info)
            bad = next((t for t in body.tokens if not 0 <= t < info.vocab_size), None)
            if bad is not None:
                raise OpenAIRequestError(
                    f"Token id {bad} is out of range for the vocabulary size {info.vocab_size}.", "tokens")
            return {"prompt": await self._backend.detokenize(body.tokens)}

        return await self._answer(answer())

    async def tokenizer_info(self) -> Response:
        async def answer() -> dict[str, Any]:
            return asdict(await self._backend.tokenizer_info())

        return await self._answer(answer())

    @staticmethod
    async def _answer(work: Awaitable[dict[str, Any]]) -> Response:
        try:
            return JSONAnswer(await work)
        except OpenAIRequestError as exc:
            return exc.answer()
        except Exception as exc:
            logger.warning("worker failed", exc_info=exc)
            return server_error(worker_failed(exc))


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": OpenAIErrorBody, "description": "A value the rules reject; `param` names the field."},
    422: {"model": OpenAIErrorBody, "description": "A body of the wrong shape."},
    503: {"model": OpenAIErrorBody, "description": "No worker could answer."},
}


def openai_router(backend: Backend) -> APIRouter:
    """The OpenAI-compatible routes over `backend`, for `app.include_router`."""
    completions = CompletionRoutes(backend)
    routes = TokenizerRoutes(backend)
    router = APIRouter(route_class=OpenAIRoute, tags=["OpenAI-compatible"])
    router.add_api_route(
        "/v1/completions", completions.completions, methods=["POST"], response_model=None,
        summary="OpenAI legacy completions; echo + logprobs scores the prompt",
        responses={200: {"model": CompletionResponse, "content": {"text/event-stream": {}},
                         "description": "One JSON answer, or with `stream` OpenAI chunks ending in [DONE]."},
                   404: {"model": OpenAIErrorBody, "description": "`model` is not the served model."},
                   **_ERRORS})
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
