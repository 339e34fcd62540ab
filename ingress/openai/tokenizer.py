"""GET /v1/models, POST /tokenize, POST /detokenize, GET /tokenizer_info: vLLM's shapes, which lm-eval's remote
tokenizer uses. No worker stream, but the same lifecycle: its errors, its 503 and its disconnect handling."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi import Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.errors import InvalidRequest, JSONAnswer
from ingress.lifecycle import Lifecycle
from ingress.openai.schemas.tokenizer import DetokenizeBody, TokenizeBody
from ingress.openai.validation import check_model, check_text
from rulebook import rules
from rulebook.rules import TOKEN_OUT_OF_RANGE


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
            # LoRA adapters as vLLM lists them: their own cards, rooted at their folder, the served model as parent.
            adapters = [{**card, "id": name, "root": path, "parent": info.model_name}
                        for name, path in (await self._backend.adapters()).items()]
            return {"object": "list", "data": [card, *adapters]}

        return await self._run(request, answer)

    async def tokenize(self, body: TokenizeBody, request: Request) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            check_model(body.model, info)
            check_text(body.prompt, info)
            tokens = await self._backend.tokenize(body.prompt, body.add_special_tokens)
            return {"tokens": tokens, "count": len(tokens), "max_model_len": info.max_model_len}

        return await self._run(request, answer)

    async def detokenize(self, body: DetokenizeBody, request: Request) -> Response:
        async def answer() -> dict[str, Any]:
            info = await self._backend.model_info()
            check_model(body.model, info)
            if (many := rules.too_many_ids(len(body.tokens), info.max_model_len)) is not None:
                raise InvalidRequest(many.message, param="tokens")
            bad = next((t for t in body.tokens if not 0 <= t < info.vocab_size), None)
            if bad is not None:
                message = TOKEN_OUT_OF_RANGE.format(token_id=bad, vocab_size=info.vocab_size)
                raise InvalidRequest(message, param="tokens")
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
