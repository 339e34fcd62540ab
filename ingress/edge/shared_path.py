"""One path that several dialects answer, told apart by the body's shape: `POST /generate` is the seed's contract
and SGLang's native API at once (rulebook/sglang.py says which body is SGLang's). Each dialect keeps its own router
in its own folder and hands a `Dialect` here; app.py puts them on the path: the path's own dialect answers every
body no other claims.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from starlette.responses import Response

Raw = dict[str, Any]


@dataclass(frozen=True)
class Dialect:
    """A dialect's share of a path: its handler, its body's JSON schema (OpenAPI), and which bodies are its own
    (None: every body no other dialect claims)."""

    handle: Callable[[Request, Raw], Awaitable[Response]]
    body_schema: dict[str, Any]
    claims: Callable[[Raw], bool] | None = None


def shared_path_router(path: str, own: Dialect, others: Sequence[Dialect], **route: Any) -> APIRouter:
    """POST `path`: a body that one of `others` claims is that dialect's, any other `own`'s; `route`: FastAPI's
    route options (summary, responses), the request body documented as any dialect's."""

    async def answer(request: Request, raw: Annotated[Raw, Body()]) -> Response:
        # FastAPI reads the body as a JSON object (its own 422 otherwise); the dialect's model validates it.
        dialect = next((d for d in others if d.claims is not None and d.claims(raw)), own)
        return await dialect.handle(request, raw)

    schema = {"required": True, "content": {"application/json": {"schema": {
        "anyOf": [own.body_schema, *(d.body_schema for d in others)]}}}}
    router = APIRouter()
    router.add_api_route(path, answer, methods=["POST"], response_model=None,
                         openapi_extra={"requestBody": schema}, **route)
    return router
