"""What the ingress needs from the workers, and its Ray Serve implementation.

The routes see only `Backend`, so unit tests inject a fake and run without Ray; `HandleBackend` is the
one real implementation, over the worker deployment's handle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol

from workers.protocol import ChatPrompt, GenerateChunk, GenerateRequest, ModelInfo, TokenizerInfo

if TYPE_CHECKING:  # Ray is only needed once a handle exists; tests of the routes never import it.
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger(__name__)


class Backend(Protocol):
    async def model_info(self) -> ModelInfo:
        """The served model's limits; raises when no worker can answer."""
        ...

    def stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """An async generator of the request's deltas, ending after the chunk with finished=True.

        Closing it (aclose) or cancelling the task that awaits it before the end must abort the
        request in the worker, so that a client that went away frees the engine's memory.
        """
        ...

    async def ready(self) -> bool:
        """True when at least one worker answers; never raises."""
        ...

    # The served tokenizer, for the OpenAI-compatible routes (the ingress has none of its own).
    # Each raises when no worker can answer.
    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`text`'s ids; by default exactly as a text prompt of `generate` is tokenized."""
        ...

    async def detokenize(self, ids: list[int]) -> str:
        """The text of in-vocabulary `ids`, special tokens included."""
        ...

    async def token_texts(self, ids: list[int]) -> list[str]:
        """Each in-vocabulary id decoded alone."""
        ...

    async def apply_chat_template(self, messages: list[dict[str, str]]) -> ChatPrompt:
        """The ids of chat `messages` under the tokenizer's chat template, with the assistant turn opened."""
        ...

    async def tokenizer_info(self) -> TokenizerInfo:
        ...


class HandleBackend:
    """Backend over the worker deployment: `generate` (streaming), `model_info`, `stats` and the tokenizer's
    `tokenize`, `detokenize`, `token_texts`, `apply_chat_template`, `tokenizer_info`."""

    def __init__(self, worker: DeploymentHandle, ready_timeout_s: float = 5.0) -> None:
        self._worker = worker
        self._stream_worker = worker.options(stream=True)
        self._ready_timeout_s = ready_timeout_s
        # Every replica serves the same model, so the first answer holds for the deployment's lifetime.
        self._info: ModelInfo | None = None
        self._tokenizer_info: TokenizerInfo | None = None

    async def model_info(self) -> ModelInfo:
        if self._info is None:
            self._info = await self._worker.model_info.remote()
        return self._info

    async def stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        response = self._stream_worker.generate.remote(req)
        finished = False
        try:
            async for chunk in response:
                finished = chunk.finished
                yield chunk
        finally:
            # Reached by aclose(), by cancellation of the consuming task (client gone) and by errors.
            # Cancelling the response cancels the replica's `generate` task: the worker sees
            # asyncio.CancelledError at its current await and aborts the request in the engine.
            if not finished:
                response.cancel()

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return await self._worker.tokenize.remote(text, add_special_tokens)

    async def detokenize(self, ids: list[int]) -> str:
        return await self._worker.detokenize.remote(ids)

    async def token_texts(self, ids: list[int]) -> list[str]:
        return await self._worker.token_texts.remote(ids)

    async def apply_chat_template(self, messages: list[dict[str, str]]) -> ChatPrompt:
        return await self._worker.apply_chat_template.remote(messages)

    async def tokenizer_info(self) -> TokenizerInfo:
        if self._tokenizer_info is None:
            self._tokenizer_info = await self._worker.tokenizer_info.remote()
        return self._tokenizer_info

    async def ready(self) -> bool:
        response = self._worker.stats.remote()
        try:
            await asyncio.wait_for(_await(response), timeout=self._ready_timeout_s)
            return True
        except Exception as exc:  # a dead, missing or busy worker all mean "not ready"
            response.cancel()
            logger.info("worker not ready: %s", type(exc).__name__)
            return False


async def _await(response: object) -> object:
    # asyncio.wait_for needs a coroutine or future; a DeploymentResponse is only awaitable.
    return await response  # type: ignore[misc]
