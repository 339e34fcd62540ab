"""POST /v1/completions: OpenAI legacy completions over the same request lifecycle as /generate.

`echo` + `logprobs` returns the prompt's logprobs (exact: the engine's scoring path, in the same request
that then generates) and the completion's; a batch of prompts is a batch of worker requests, one choice
each. The lifecycle (lifecycle.py) decides the status from every prompt's first chunk, aborts every request
of the batch when the client goes away, and reports a failure once bytes are out as a final `error` chunk,
which this route sends as OpenAI's in-band error event before [DONE].
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator

from fastapi import Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.errors import IngressError, JSONAnswer, ServerError, finish_error, worker_failed
from ingress.lifecycle import Batch, Lifecycle, all_or_none
from ingress.openai_format import ChoiceBuilder, completion_json, echo_only_chunk, error_json, usage_json
from ingress.openai_schemas import CompletionBody
from ingress.openai_validation import (
    CompletionSettings,
    check_prompt,
    prompt_items,
    prompt_request,
    validate_completion,
)
from ingress.request_record import current_request_id
from ingress.streaming import SSE_DONE, sse_data
from workers.protocol import GenerateChunk

logger = logging.getLogger(__name__)
Head = tuple[str, int, str]  # id, created, model


class CompletionRoutes:
    """The /v1/completions handler bound to one backend (openai_routes.py wires it)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def completions(self, body: CompletionBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda batch: self._complete(body, batch))

    async def _complete(self, body: CompletionBody, batch: Batch) -> Response:
        info = await self._backend.model_info()
        settings = validate_completion(body, info)
        items = prompt_items(body.prompt)
        ids_list = await all_or_none(self._ids(item) for item in items)
        for i, ids in enumerate(ids_list):
            check_prompt(i, ids, settings, info, batch=len(items) > 1)

        cid = f"cmpl-{current_request_id() or uuid.uuid4().hex}"
        head = (cid, int(time.time()), info.model_name)
        choices = [ChoiceBuilder(i, ids, item if isinstance(item, str) else "", settings.echo, settings.logprobs)
                   for i, (item, ids) in enumerate(zip(items, ids_list, strict=True))]
        # Choice index -> worker request; an echo with nothing to compute sends none.
        requests = {i: req for i, ids in enumerate(ids_list)
                    if (req := prompt_request(f"{cid}-{i}", ids, settings)) is not None}
        batch.open(list(requests.values()))
        # The echoed text of prompts sent as ids is decoded while the first chunks come.
        worker_firsts, _ = await all_or_none([batch.firsts(), self._prompt_texts(choices, items, settings)])
        by_choice = dict(zip(requests, worker_firsts, strict=True))
        firsts = [by_choice.get(i) or echo_only_chunk(f"{i}", len(c.prompt_ids)) for i, c in enumerate(choices)]
        if settings.stream:
            return batch.stream(self._events(head, choices, firsts, list(requests), batch, settings))
        by_choice = dict(zip(requests, await batch.collect(), strict=True))
        wholes = [by_choice.get(i, first) for i, first in enumerate(firsts)]
        texts = await self._texts(set().union(*(c.needed_ids(w) for c, w in zip(choices, wholes, strict=True))))
        out = [c.delta(w, texts) for c, w in zip(choices, wholes, strict=True)]
        return JSONAnswer(completion_json(*head, out, usage_json(choices)))

    async def _ids(self, item: str | list[int]) -> list[int]:
        return await self._backend.tokenize(item) if isinstance(item, str) else list(item)

    async def _prompt_texts(self, choices: list[ChoiceBuilder], items: list[str | list[int]],
                            settings: CompletionSettings) -> None:
        """What `echo` returns for prompts sent as ids: their decoded text (a text prompt echoes itself)."""
        if not settings.echo:
            return
        todo = [c for c, item in zip(choices, items, strict=True) if not isinstance(item, str)]
        texts = await all_or_none(self._backend.detokenize(c.prompt_ids) for c in todo)
        for c, text in zip(todo, texts, strict=True):
            c.prompt_text = text

    async def _texts(self, ids: set[int]) -> dict[int, str]:
        if not ids:
            return {}
        order = sorted(ids)
        return dict(zip(order, await self._backend.token_texts(order), strict=True))

    async def _events(self, head: Head, choices: list[ChoiceBuilder], firsts: list[GenerateChunk],
                      choice_of: list[int], batch: Batch, settings: CompletionSettings) -> AsyncGenerator[str, None]:
        """Each prompt's chunks as OpenAI chunks: the first ones in order, then as they arrive (each names its
        choice `index`), then usage when asked for, then [DONE]. `choice_of[j]` is worker request j's choice.
        Once bytes are out, a failure is an in-band `error` event."""
        with_usage = settings.include_usage

        async def event(i: int, chunk: GenerateChunk) -> str:
            texts = await self._texts(choices[i].needed_ids(chunk))
            return sse_data(completion_json(*head, [choices[i].delta(chunk, texts)], with_usage=with_usage))

        try:
            for i, chunk in enumerate(firsts):
                yield await event(i, chunk)
            async with contextlib.aclosing(batch.rest()) as rest:
                async for j, chunk in rest:
                    if (error := finish_error(chunk.finish_reason)) is not None:
                        raise error  # OpenAI has no `error` finish: the stream ends with an error event
                    yield await event(choice_of[j], chunk)
            if with_usage:
                yield sse_data(completion_json(*head, [], usage_json(choices)))
        except Exception as exc:  # CancelledError / GeneratorExit are BaseException: they pass through
            logger.warning("completion failed mid-stream, id=%s", head[0], exc_info=exc)
            message = exc.message if isinstance(exc, IngressError) else worker_failed(exc)
            yield sse_data(error_json(ServerError(message)))
        yield SSE_DONE
