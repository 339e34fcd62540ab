"""POST /generate: the contract's route (the seed's LMDeploy shape), one prompt or a batch of prompts, over the
shared lifecycle. The body is read once and validated against the contract's model here. SGLang's body on the same
path is SGLang's router's (ingress/sglang/router.py); app.py puts both on it (ingress/edge/shared_path.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response

from ingress.adapters.select import adapter_by_name, lora_name
from ingress.backend import Backend
from ingress.edge.openapi import error_responses
from ingress.edge.shared_path import Dialect, shared_path_router
from ingress.errors import InvalidRequest, JSONAnswer, located
from ingress.generate.render import chunk_json, sse_event
from ingress.generate.schemas import ErrorBody as ErrorModel
from ingress.generate.schemas import GenerateBody, GenerateResponse
from ingress.generate.validation import split_batch, to_request, validate, validate_batch
from ingress.lifecycle import Exchange, Lifecycle
from ingress.request_checks import check_causal, check_tokenized
from ingress.sse import SSE_DONE, sse_data
from protocol import GenerateRequest, ModelInfo, RequestOutput
from rulebook import generate_fields, rules
from rulebook.adapters import ADAPTER_TWICE


class GenerateRoutes:
    """Route handlers bound to one backend; the FastAPI app is only their wiring."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def generate(self, request: Request, raw: dict[str, Any]) -> Response:
        try:
            body = GenerateBody.model_validate(raw)
        except ValidationError as exc:
            raise RequestValidationError(located(exc.errors(include_url=False), "body")) from exc
        undeclared = (generate_fields.undeclared_field(name, value) for name, value in raw.items()
                      if name not in GenerateBody.model_fields)
        broken = next((v for v in undeclared if v is not None), None)
        if broken is not None:
            return self._lifecycle.answer(InvalidRequest(broken.message, param=broken.param))
        return await self._lifecycle.run(request, lambda exchange: self._generate(body, exchange))

    async def _generate(self, body: GenerateBody, exchange: Exchange) -> Response:
        """One prompt (the batch of one), or SGLang's batch: a list of prompts, one worker request each, admitted
        as one unit so the prefix cache shares what they have in common. Streamed, all are one streaming worker call
        (Exchange.open: a stream each); not streamed, all go in one unary worker call (Exchange.answers), the
        cheapest way through Serve."""
        info = await self._backend.model_info()
        check_causal(info, "/generate")
        exchange.adapter = await adapter_by_name(self._backend, *_adapter_field(body))
        items = split_batch(body)
        if items is None:
            validate(body, info)
        else:
            validate_batch(items, info)
        requests = await self._requests(items or [body], info)
        flat = bool(body.return_flat_logprobs_b64)
        if body.stream:
            exchange.open(requests, info)
            first_chunks = await exchange.first_chunks()
            return exchange.stream(_events(first_chunks, exchange, indexed=items is not None, flat=flat))
        answers = await exchange.answers(requests, info)  # one unary worker call for the whole batch
        if items is None:
            return JSONAnswer(chunk_json(answers[0], flat))
        return JSONAnswer([chunk_json(whole, flat) for whole in answers])


    async def _requests(self, bodies: list[GenerateBody], info: ModelInfo) -> list[GenerateRequest]:
        """The checked bodies' canonical requests: their text prompts tokenized here (one call for all of them),
        then checked against the context as a prompt of ids is (a batch's failure names its item)."""
        texts = [b.prompt for b in bodies if b.input_ids is None]
        tokenized = iter(await self._backend.tokenize_many(texts) if texts else [])  # type: ignore[arg-type]
        requests = []
        for i, b in enumerate(bodies):
            request = to_request(b, None if b.input_ids is not None else next(tokenized))
            if b.input_ids is None:
                try:
                    check_tokenized(request.params, request.input_ids, info)
                except InvalidRequest as exc:
                    if len(bodies) == 1:
                        raise
                    raise InvalidRequest(rules.ITEM.format(i=i, message=exc.message)) from exc
            requests.append(request)
        return requests


def _adapter_field(body: GenerateBody) -> tuple[str | None, str]:
    """(the adapter's name, the field that named it): our `adapter` or SGLang's `lora_path` (for a batch, one name
    for every item: a request runs with one adapter)."""
    if body.adapter is not None and body.lora_path is not None:
        raise InvalidRequest(ADAPTER_TWICE, param="lora_path")
    return (body.adapter, "adapter") if body.adapter is not None else (lora_name(body.lora_path), "lora_path")


async def _events(first_chunks: list[RequestOutput], exchange: Exchange, indexed: bool, flat: bool = False
                  ) -> AsyncGenerator[str, None]:
    """One event per worker chunk, then one `[DONE]`; a failure once bytes are out is the final `error` event.
    A batch's events name their item (`index`): the first chunks in order, then as they arrive."""

    def event(i: int, chunk: RequestOutput) -> str:
        return sse_data({**chunk_json(chunk, flat), "index": i}) if indexed else sse_event(chunk, flat)

    for i, chunk in enumerate(first_chunks):
        yield event(i, chunk)
    async with contextlib.aclosing(exchange.later_chunks()) as later:
        async for i, chunk in later:
            yield event(i, chunk)
    yield SSE_DONE


def generate_router(backend: Backend, lifecycle: Lifecycle, others: tuple[Dialect, ...] = ()) -> APIRouter:
    """POST /generate over `backend`, for `app.include_router`: the contract's bodies, and those that a dialect of
    `others` claims (SGLang's) answered by that dialect; `lifecycle` has the contract's error body."""
    routes = GenerateRoutes(backend, lifecycle)
    own = Dialect(handle=routes.generate, body_schema=GenerateBody.model_json_schema())
    return shared_path_router(
        "/generate", own, others, name="generate",
        summary="Generate from, or score, a prompt or a batch of prompts (the seed's shape, or SGLang's: "
                "a body with sampling_params or text)",
        responses={
            200: {"model": GenerateResponse | list[GenerateResponse],
                  "content": {"text/event-stream": {}},
                  "description": "One JSON answer (a list of them, in order, for a batch), or with `stream` "
                                 "server-sent events of deltas ending in [DONE] (a batch's events carry `index`)."},
            **error_responses(ErrorModel, body=True, generates=True, own_422=False),
        })
