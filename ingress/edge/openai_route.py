"""The route class of every API whose errors have OpenAI's body (OpenAI's routes, vLLM's token route, the
classifiers'): a malformed body's 422 in that shape instead of FastAPI's `detail` list."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ingress.edge.openapi import error_responses
from ingress.errors import InvalidRequest, JSONAnswer, bounded_errors
from ingress.openai.render.common import error_json
from ingress.openai.schemas.common import OpenAIErrorBody


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
MODEL_ERRORS = error_responses(OpenAIErrorBody, body=True, generates=True, names_model=True)
