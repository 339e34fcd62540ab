"""SGLang's /generate over the shared lifecycle: the same limits, admission, coalescing, request ids, deadline,
disconnect and retry as the seed's shape (ingress/lifecycle.py); only the body and the answer are SGLang's.

Not streamed, a body's items go in one unary worker call (Exchange.answers, coalesced under load like the seed's);
streamed, the items are one streaming worker call (Exchange.open) and every event is the item's answer so far, then
`data: [DONE]`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ingress.adapters.select import adapter_by_name, lora_name
from ingress.backend import Backend
from ingress.errors import JSONAnswer, enforce
from ingress.images import image_limits
from ingress.lifecycle import Exchange, Lifecycle
from ingress.output.token_texts import token_texts
from ingress.sglang.render import Texts, answer_json, token_ids_needed
from ingress.sglang.translate import Item, Parsed, build, image_blobs
from ingress.sse import SSE_DONE, sse_data
from protocol import ImageData, ModelInfo, RequestOutput, merge_outputs
from rulebook import images as img


class SGLangGenerate:
    """POST /generate for SGLang-shaped bodies (rulebook/sglang.py: how a body is told apart)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def generate(self, parsed: Parsed, request: Request) -> Response:
        started = time.monotonic()
        return await self._lifecycle.run(request, lambda exchange: self._work(parsed, exchange, started))

    async def _work(self, parsed: Parsed, exchange: Exchange, started: float) -> Response:
        info = await self._backend.model_info()
        exchange.adapter = await adapter_by_name(self._backend, lora_name(parsed.body.lora_path), "lora_path")
        images = await self._images(parsed, info, exchange)
        items = await build(parsed, info, lambda text: self._backend.tokenize(text), images)
        requests = [item.request for item in items]
        as_list = len(items) > 1 or not parsed.single
        if parsed.body.stream:
            exchange.open(requests, info)
            first_chunks = await exchange.first_chunks()
            return exchange.stream(self._events(items, first_chunks, exchange, as_list, started,
                                             parsed.body.return_flat_logprobs_b64))
        answers = await exchange.answers(requests, info)
        texts = await self._texts(items, answers)
        latency = time.monotonic() - started
        flat = parsed.body.return_flat_logprobs_b64
        bodies = [answer_json(item, whole, texts, latency, flat) for item, whole in zip(items, answers, strict=True)]
        return JSONAnswer(bodies if as_list else bodies[0])

    async def _images(self, parsed: Parsed, info: ModelInfo, exchange: Exchange) -> list[list[ImageData]] | None:
        """Each prompt's images decoded and preprocessed (one thread call for the body), or None without any."""
        blobs = image_blobs(parsed)
        flat = [b for item in blobs for b in item]
        if not flat:
            return None
        enforce(img.no_images_here(len(flat), info.takes_images, "image_data"))
        done = iter(await self._backend.prepare_images(flat, image_limits(exchange.settings), "image_data"))
        return [[next(done) for _ in item] for item in blobs]

    async def _texts(self, items: list[Item], chunks: list[RequestOutput]) -> Texts | None:
        """Each token's text, for return_text_in_logprobs (the ingress's tokenizer, every id of the answer at once)."""
        ids: set[int] = set()
        for item, chunk in zip(items, chunks, strict=True):
            ids |= token_ids_needed(item, chunk)
        return await token_texts(self._backend, ids) if ids else None

    async def _events(self, items: list[Item], first_chunks: list[RequestOutput], exchange: Exchange, as_list: bool,
                      started: float, flat: bool) -> AsyncGenerator[str, None]:
        """Each worker chunk as the item's answer so far (a batch's events name their item: `index`), then [DONE]."""
        merged: list[RequestOutput | None] = [None] * len(items)

        async def event(i: int, chunk: RequestOutput) -> str:
            so_far = merged[i]
            whole = chunk if so_far is None else merge_outputs([so_far, chunk])
            merged[i] = whole
            texts = await self._texts([items[i]], [whole])
            body: dict[str, Any] = answer_json(items[i], whole, texts, time.monotonic() - started, flat)
            return sse_data({**body, "index": i} if as_list else body)

        for i, chunk in enumerate(first_chunks):
            yield await event(i, chunk)
        async with contextlib.aclosing(exchange.later_chunks()) as later:
            async for i, chunk in later:
                yield await event(i, chunk)
        yield SSE_DONE
