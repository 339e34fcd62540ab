"""POST /v1/completions: OpenAI legacy completions over the same request lifecycle as /generate.

`echo` + `logprobs` returns the prompt's logprobs (exact: the engine's scoring path, in the same request
that then generates) and the completion's; a batch of prompts is a batch of worker requests, one choice
each. The lifecycle (lifecycle.py) decides the status from every prompt's first chunk, aborts every request
of the batch when the client goes away, and reports a failure once bytes are out as a final `error` chunk,
which this route sends as OpenAI's in-band error event before [DONE].
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator

from fastapi import Request
from starlette.responses import Response

from ingress.adapters.select import adapter_for_model
from ingress.backend import Backend
from ingress.classify.validation import check_causal
from ingress.edge.request_record import current_request_id
from ingress.errors import JSONAnswer
from ingress.lifecycle import Batch, Lifecycle, all_or_none
from ingress.openai.answer import openai_events, token_texts
from ingress.openai.render import ChoiceBuilder, completion_json, echo_only_chunk, usage_json
from ingress.openai.schemas import CompletionBody
from ingress.openai.validation import (
    CompletionSettings,
    check_prompt,
    check_text,
    prompt_items,
    prompt_request,
    validate_completion,
)
from ingress.sse import sse_data
from workers.protocol import GenerateChunk

Head = tuple[str, int, str]  # id, created, model


class CompletionRoutes:
    """The /v1/completions handler bound to one backend (router.py wires it)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def completions(self, body: CompletionBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda batch: self._complete(body, batch))

    async def _complete(self, body: CompletionBody, batch: Batch) -> Response:
        info = await self._backend.model_info()
        batch.adapter = await adapter_for_model(self._backend, body.model, info)
        settings = validate_completion(body.model_copy(update={"model": None}), info)
        check_causal(info, "/v1/completions")
        items = prompt_items(body.prompt)
        ids_list = await all_or_none(self._ids(item) for item in items)
        for i, ids in enumerate(ids_list):
            check_prompt(i if len(items) > 1 else None, ids, settings.params.max_tokens, info)

        cid = f"cmpl-{current_request_id() or uuid.uuid4().hex}"
        head = (cid, int(time.time()), info.model_name)
        choices = [ChoiceBuilder(i, ids, item if isinstance(item, str) else "", settings.echo, settings.logprobs)
                   for i, (item, ids) in enumerate(zip(items, ids_list, strict=True))]
        # Choice index -> worker request; an echo with nothing to compute sends none.
        requests = {i: req for i, ids in enumerate(ids_list)
                    if (req := prompt_request(f"{cid}-{i}", ids, settings)) is not None}
        # The echoed text of prompts sent as ids is decoded while the worker answers.
        echoed = self._prompt_texts(choices, items, settings)
        if settings.stream:
            batch.open(list(requests.values()), info)
            worker_firsts, _ = await all_or_none([batch.firsts(), echoed])
        else:  # one unary worker call for every prompt (Batch.answers)
            worker_firsts, _ = await all_or_none([batch.answers(list(requests.values()), info), echoed])
        by_choice = dict(zip(requests, worker_firsts, strict=True))
        firsts = [by_choice.get(i) or echo_only_chunk(f"{i}", len(c.prompt_ids)) for i, c in enumerate(choices)]
        if settings.stream:
            return batch.stream(self._events(head, choices, firsts, list(requests), batch, settings))
        wholes = firsts
        needed = set().union(*(c.needed_ids(w) for c, w in zip(choices, wholes, strict=True)))
        texts = await token_texts(self._backend, needed)
        out = [c.delta(w, texts) for c, w in zip(choices, wholes, strict=True)]
        return JSONAnswer(completion_json(*head, out, usage_json(choices)))

    async def _ids(self, item: str | list[int]) -> list[int]:
        if not isinstance(item, str):
            return list(item)
        check_text(item, await self._backend.model_info())
        return await self._backend.tokenize(item)

    async def _prompt_texts(self, choices: list[ChoiceBuilder], items: list[str | list[int]],
                            settings: CompletionSettings) -> None:
        """What `echo` returns for prompts sent as ids: their decoded text (a text prompt echoes itself)."""
        if not settings.echo:
            return
        todo = [c for c, item in zip(choices, items, strict=True) if not isinstance(item, str)]
        if not todo:
            return
        # One worker call for the whole batch (lm-eval sends 8 prompts as ids a request), not one per prompt.
        texts = await self._backend.detokenize_many([c.prompt_ids for c in todo])
        for c, text in zip(todo, texts, strict=True):
            c.prompt_text = text

    def _events(self, head: Head, choices: list[ChoiceBuilder], firsts: list[GenerateChunk],
                      choice_of: list[int], batch: Batch, settings: CompletionSettings) -> AsyncGenerator[str, None]:
        """Each prompt's chunks as OpenAI chunks (each names its choice `index`), then usage when asked for."""
        with_usage = settings.include_usage

        async def event(i: int, chunk: GenerateChunk) -> str:
            texts = await token_texts(self._backend, choices[i].needed_ids(chunk))
            return sse_data(completion_json(*head, [choices[i].delta(chunk, texts)], with_usage=with_usage))

        def usage() -> str:
            return sse_data(completion_json(*head, [], usage_json(choices)))

        return openai_events(head[0], firsts, batch, event, choice_of, usage if with_usage else None)
