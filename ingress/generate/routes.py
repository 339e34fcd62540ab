"""POST /generate: the contract's route, one prompt or SGLang's batch of prompts, over the shared lifecycle.

One path, two dialects: a body with `sampling_params` or `text` is SGLang's native shape (ingress/sglang/), any other
the seed's LMDeploy shape (the contract). The body is read here, once, and validated against its dialect's model.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response

from ingress.adapters.select import adapter_by_name, lora_name
from ingress.backend import Backend
from ingress.canonical import check_causal, check_tokenized
from ingress.edge.openapi import error_responses
from ingress.errors import IngressError, InvalidRequest, JSONAnswer, located
from ingress.generate.render import chunk_json, error_json, sse_event
from ingress.generate.schemas import ErrorBody as ErrorModel
from ingress.generate.schemas import GenerateBody, GenerateResponse
from ingress.generate.validation import split_batch, to_request, validate, validate_batch
from ingress.lifecycle import Batch, Lifecycle
from ingress.retry import RetryCounter
from ingress.settings import IngressSettings
from ingress.sglang.routes import SGLangGenerate
from ingress.sglang.schemas import SGLangBody
from ingress.sglang.translate import SamplingTypeError, parse
from ingress.sse import SSE_DONE, sse_data
from protocol import GenerateChunk, GenerateRequest, ModelInfo
from rulebook import generate_fields, rules
from rulebook import sglang as sg
from rulebook.adapters import ADAPTER_TWICE


def body_schema() -> dict[str, Any]:
    """The request body of /generate for OpenAPI: either dialect's shape (both models are flat, so they inline)."""
    return {"required": True, "content": {"application/json": {"schema": {"anyOf": [
        GenerateBody.model_json_schema(), SGLangBody.model_json_schema()]}}}}


class GenerateRoutes:
    """Route handlers bound to one backend; the FastAPI app is only their wiring."""

    def __init__(self, backend: Backend, settings: IngressSettings, retries: RetryCounter) -> None:
        self._backend = backend
        self._lifecycle = Lifecycle(backend, error_json, settings, retries)
        self._sglang = SGLangGenerate(backend, self._lifecycle)

    async def generate(self, request: Request, raw: Annotated[dict[str, Any], Body()]) -> Response:
        # FastAPI reads the body as a JSON object (its own 422 otherwise); the dialect's model validates it here.
        if sg.is_sglang(raw):
            try:
                parsed = parse(raw)
            except IngressError as exc:
                return self._lifecycle.answer(exc)
            except ValidationError as exc:
                raise RequestValidationError(located(exc.errors(include_url=False), "body")) from exc
            except SamplingTypeError as exc:
                raise RequestValidationError(located(exc.errors, "body")) from exc
            return await self._sglang.generate(parsed, request)
        try:
            body = GenerateBody.model_validate(raw)
        except ValidationError as exc:
            raise RequestValidationError(located(exc.errors(include_url=False), "body")) from exc
        undeclared = (generate_fields.undeclared_field(name, value) for name, value in raw.items()
                      if name not in GenerateBody.model_fields)
        broken = next((v for v in undeclared if v is not None), None)
        if broken is not None:
            return self._lifecycle.answer(InvalidRequest(broken.message, param=broken.param))
        return await self._lifecycle.run(request, lambda batch: self._generate(body, batch))

    async def _generate(self, body: GenerateBody, batch: Batch) -> Response:
        """One prompt (the batch of one), or SGLang's batch: a list of prompts, one worker request each, admitted
        as one unit so the prefix cache shares what they have in common. Streamed, all are one streaming worker call
        (Batch.open: a stream each); not streamed, all go in one unary worker call (Batch.answers), the cheapest way
        through Serve."""
        info = await self._backend.model_info()
        check_causal(info, "/generate")
        batch.adapter = await adapter_by_name(self._backend, *_adapter_field(body))
        items = split_batch(body)
        if items is None:
            validate(body, info)
        else:
            validate_batch(items, info)
        requests = await self._requests(items or [body], info)
        flat = bool(body.return_flat_logprobs_b64)
        if body.stream:
            batch.open(requests, info)
            firsts = await batch.firsts()
            return batch.stream(_events(firsts, batch, indexed=items is not None, flat=flat))
        wholes = await batch.answers(requests, info)  # one unary worker call for the whole batch
        if items is None:
            return JSONAnswer(chunk_json(wholes[0], flat))
        return JSONAnswer([chunk_json(whole, flat) for whole in wholes])


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


async def _events(firsts: list[GenerateChunk], batch: Batch, indexed: bool, flat: bool = False
                  ) -> AsyncGenerator[str, None]:
    """One event per worker chunk, then one `[DONE]`; a failure once bytes are out is the final `error` event.
    A batch's events name their item (`index`): the first chunks in order, then as they arrive."""

    def event(i: int, chunk: GenerateChunk) -> str:
        return sse_data({**chunk_json(chunk, flat), "index": i}) if indexed else sse_event(chunk, flat)

    for i, chunk in enumerate(firsts):
        yield event(i, chunk)
    async with contextlib.aclosing(batch.rest()) as rest:
        async for i, chunk in rest:
            yield event(i, chunk)
    yield SSE_DONE


def generate_router(backend: Backend, settings: IngressSettings, retries: RetryCounter) -> APIRouter:
    """POST /generate over `backend`, for `app.include_router`."""
    routes = GenerateRoutes(backend, settings, retries)
    router = APIRouter()
    router.add_api_route(
        "/generate", routes.generate, methods=["POST"], response_model=None,
        openapi_extra={"requestBody": body_schema()},
        summary="Generate from, or score, a prompt or a batch of prompts (the seed's shape, or SGLang's: "
                "a body with sampling_params or text)",
        responses={
            200: {"model": GenerateResponse | list[GenerateResponse],
                  "content": {"text/event-stream": {}},
                  "description": "One JSON answer (a list of them, in order, for a batch), or with `stream` "
                                 "server-sent events of deltas ending in [DONE] (a batch's events carry `index`)."},
            **error_responses(ErrorModel, body=True, generates=True, own_422=False),
        })
    return router
