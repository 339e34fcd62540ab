"""The text side of the transport: this replica's tokenizer, chat template and image processor (ingress/text.py,
ingress/images.py), loaded from the model folder the workers report, called by the parses and renderers directly:
no worker call. Each method runs its work in a thread (a long text takes seconds; the event loop keeps streaming)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ingress.images import ImageBlob, ImageLimits, ImageSide, prepare_images
from ingress.lazy import Lazy
from ingress.text import TextSide
from protocol import ChatPrompt, ImageData, ModelInfo, TokenizerInfo

logger = logging.getLogger(__name__)


class TextClient:
    """Backend's text methods over this replica's own tokenizer; `model_info` tells the folder (and the runtime
    limits the text checks use)."""

    def __init__(self, model_info: Callable[[], Awaitable[ModelInfo]]) -> None:
        self._model_info = model_info
        self._text: Lazy[TextSide] = Lazy(TextSide)
        self._images: Lazy[ImageSide] = Lazy(ImageSide)
        self._warming: asyncio.Task[None] | None = None

    async def text_side(self) -> TextSide:
        info = await self._model_info()
        text = await self._text.get(info)
        # The runtime limits (prompt_chars_per_token) follow the refreshed ModelInfo; the tokenizer stays.
        text.info = info
        return text

    async def tokenizer(self) -> Any:
        """The served tokenizer (transformers'), for the output processor (ingress/output/)."""
        return (await self.text_side()).tokenizer

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return await asyncio.to_thread((await self.text_side()).encode, text, add_special_tokens)

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        return await asyncio.to_thread((await self.text_side()).encode_many, texts)

    async def detokenize(self, ids: list[int]) -> str:
        return await asyncio.to_thread((await self.text_side()).decode, ids)

    async def detokenize_many(self, prompts: list[list[int]]) -> list[str]:
        return await asyncio.to_thread((await self.text_side()).decode_many, prompts)

    async def token_texts(self, ids: list[int]) -> list[str]:
        text = await self.text_side()
        known = text.cached_token_texts(ids)  # the usual case once the ingress has answered for a while
        return known if known is not None else await asyncio.to_thread(text.token_texts, ids)

    async def apply_chat_template(self, messages: list[dict[str, Any]],
                                  image_ids: tuple[int, ...] = ()) -> ChatPrompt:
        return await asyncio.to_thread((await self.text_side()).chat_prompt, messages, image_ids)

    async def prepare_images(self, blobs: list[ImageBlob], limits: ImageLimits, param: str) -> list[ImageData]:
        return await prepare_images(await self._images.get(await self._model_info()), blobs, limits, param)

    async def tokenizer_info(self) -> TokenizerInfo:
        return (await self.text_side()).tokenizer_info()

    def warm(self) -> None:
        """Load the tokenizer in the background once a worker can tell the model (a health probe, Serve's health
        check), not inside the first request, which would otherwise spend the load's seconds before any worker."""
        if not self._text.loaded and self._warming is None:
            # In an empty context, not a request's: Serve files the model-info call it may make under no route.
            self._warming = asyncio.create_task(self._warm_text(), context=contextvars.Context())

    async def _warm_text(self) -> None:
        try:
            await self.text_side()
        except Exception as exc:  # noqa: BLE001  # the first request that needs the text side tries again
            logger.info("tokenizer warm-up failed: %s", type(exc).__name__)
        finally:
            self._warming = None
