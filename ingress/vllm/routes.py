"""vLLM 0.32's token-in / token-out route, POST /inference/v1/generate (what prime-rl's external teacher calls), and
POST /inference/v1/abort_requests, over the shared lifecycle: one worker call per request (unary, or one stream),
the same limits, request ids, deadline, disconnect and retry as every route. Errors have OpenAI's body, as vLLM's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import Body, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response

from ingress.adapters.select import served_model
from ingress.backend import Backend
from ingress.errors import IngressError, InvalidRequest, JSONAnswer, enforce, located
from ingress.images import image_limits
from ingress.lifecycle import Exchange, Lifecycle
from ingress.openai.render.stream import openai_events
from ingress.output.token_texts import token_texts
from ingress.request_checks import check_causal
from ingress.sse import sse_data
from ingress.vllm import render
from ingress.vllm.media import content_part_blobs
from ingress.vllm.parse import TokenRequest, check_fields, engine_rid, parse
from ingress.vllm.schemas import AbortRequestsBody, TokenGenerateBody
from protocol import ImageData, RequestOutput
from protocol.control import Abort
from rulebook import images as img
from rulebook import vllm_generate as vg

ROUTE = "/inference/v1/generate"


class TokenRoutes:
    """The handlers bound to one backend (openai/router.py wires them)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def generate(self, request: Request, raw: Annotated[dict[str, Any], Body()]) -> Response:
        try:
            check_fields(raw)
        except IngressError as exc:
            return self._lifecycle.answer(exc)
        try:
            body = TokenGenerateBody.model_validate(raw)
        except ValidationError as exc:
            raise RequestValidationError(located(exc.errors(include_url=False), "body")) from exc
        return await self._lifecycle.run(request, lambda exchange: self._work(body, exchange))

    async def _work(self, body: TokenGenerateBody, exchange: Exchange) -> Response:
        info = await served_model(self._backend, exchange, body.model)
        check_causal(info, ROUTE)
        limit = info.max_top_logprobs if info.max_top_logprobs is not None else exchange.settings.max_top_logprobs
        blobs = content_part_blobs(body.content_parts)
        images: list[ImageData] = []
        if blobs:  # decoded off the event loop, as every dialect's images (ingress/images.py)
            enforce(img.no_images_here(len(blobs), info.takes_images, "content_parts"))
            images = await self._backend.prepare_images(blobs, image_limits(exchange.settings), "content_parts")
        tr = parse(body, info, limit, images)
        model = exchange.adapter[0] if exchange.adapter is not None else info.model_name
        if tr.stream:
            exchange.open([tr.request], info)
            first_chunks = await exchange.first_chunks()
            return exchange.stream(self._events(tr, first_chunks, exchange))
        (whole,) = await exchange.answers([tr.request], info)
        texts = await token_texts(self._backend, render.needed_ids(tr, whole))
        return JSONAnswer(await render.answer_json(tr, whole, model, texts, self._decode))

    async def _decode(self, ids: list[int]) -> str:
        return await self._backend.detokenize(ids)

    def _events(self, tr: TokenRequest, first_chunks: list[RequestOutput],
                exchange: Exchange) -> AsyncGenerator[str, None]:
        state = {"first": True, "generated": 0}
        last: list[RequestOutput] = []

        async def event(_: int, chunk: RequestOutput) -> str:
            last[:] = [chunk]
            state["generated"] += len(chunk.new_token_ids)
            # vLLM sends a chunk for new tokens or a finish only (a prefill's chunk has neither).
            if not chunk.new_token_ids and not chunk.finished:
                return ""
            body = render.stream_chunk_json(tr, chunk, bool(state["first"]), int(state["generated"]))
            state["first"] = False
            return sse_data(body)

        def usage() -> str:
            return sse_data(render.usage_chunk_json(tr, last[0])) if last else ""

        return openai_events(tr.request.rid, first_chunks, exchange, event, [0], usage if tr.include_usage else None)

    async def abort_requests(self, raw: Annotated[dict[str, Any], Body()]) -> Response:
        """vLLM's: abort each named request (its body's request_id or the answer's); answered at once, empty."""
        try:
            body = AbortRequestsBody.model_validate(raw)
        except ValidationError as exc:
            raise RequestValidationError(located(exc.errors(include_url=False), "body")) from exc
        if body.request_ids is None:
            return self._lifecycle.answer(InvalidRequest(vg.ABORT_IDS, param="request_ids"))
        for rid in body.request_ids:
            result = await self._backend.control(Abort(engine_rid(rid)))
            if not result.success:
                return JSONAnswer({"error": {"message": result.message, "type": "service_unavailable",
                                             "param": None, "code": 503}}, status_code=503)
        return Response(status_code=200)
