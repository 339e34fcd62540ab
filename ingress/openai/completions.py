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
from dataclasses import dataclass, replace

from fastapi import Request
from starlette.responses import Response

from ingress.adapters.select import served_model
from ingress.backend import Backend
from ingress.edge.request_record import current_request_id
from ingress.errors import InvalidRequest, JSONAnswer, enforce
from ingress.lifecycle import Exchange, Lifecycle, all_or_none
from ingress.limits import check_limits
from ingress.openai.render.common import completion_json, echo_only_chunk, usage_json
from ingress.openai.render.completions import ChoiceBuilder
from ingress.openai.render.stream import openai_events
from ingress.openai.schemas.completions import CompletionBody
from ingress.openai.validation import (
    VllmFields,
    check_fields,
    check_logprobs,
    check_prompt,
    check_text,
    include_usage,
    sampling_params,
    scoring_params,
    vllm_fields,
)
from ingress.output.token_texts import token_texts
from ingress.request_checks import check_causal
from ingress.sse import sse_data
from protocol import GenerateRequest, ModelInfo, RequestOutput, SamplingParams
from rulebook import openai as msg
from rulebook import rules

Head = tuple[str, int, str]  # id, created, model
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions


@dataclass(frozen=True)
class CompletionSettings:
    """A validated body's settings with OpenAI's defaults applied (null = default)."""

    echo: bool
    logprobs: int | None  # None: no logprobs at all; k >= 0: the token's own and k alternatives
    stream: bool
    include_usage: bool
    # Every prompt's parameters but the scoring boundary, which depends on the prompt (`prompt_request`).
    params: SamplingParams
    vllm: VllmFields


def validate_completion(body: CompletionBody, info: ModelInfo) -> CompletionSettings:
    """Raise InvalidRequest for the first rule the body breaks (its `model` is served_model's to check); return its
    settings otherwise.
    Prompt contents are checked later, once text prompts are tokenized (`check_prompt`)."""
    check_fields(body)
    _check_prompt_not_empty(body.prompt)
    echo = bool(body.echo)
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    enforce(rules.negative_max_tokens(max_tokens), param="max_tokens")
    if max_tokens == 0 and not echo:
        raise InvalidRequest(msg.ZERO_NEEDS_ECHO, param="max_tokens")
    k = body.logprobs
    check_logprobs(k, info, "logprobs")
    params = sampling_params(body, info, max_tokens, k)
    return CompletionSettings(echo=echo, logprobs=k, stream=bool(body.stream), include_usage=include_usage(body),
                              params=params, vllm=vllm_fields(body, info, params))


def _check_prompt_not_empty(prompt: str | list) -> None:
    if prompt == "" or prompt == []:
        raise InvalidRequest(msg.EMPTY_PROMPT, param="prompt")
    if isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if item == "" or item == []:
                raise InvalidRequest(msg.EMPTY_PROMPT_AT.format(i=i), param="prompt")


def prompt_items(prompt: str | list) -> list[str | list[int]]:
    """The body's prompt as a batch: each item a string or a token-id list (one choice each)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def scores_prompt(ids: list[int], s: CompletionSettings) -> bool:
    """Whether the prompt's own logprobs are asked for (echo's, vLLM's prompt_logprobs) and exist (its first token
    is never scored)."""
    return (s.echo and s.logprobs is not None or s.vllm.prompt_logprobs is not None) and len(ids) >= 2


def prompt_request(rid: str, ids: list[int], s: CompletionSettings) -> GenerateRequest | None:
    """The worker's carrier for one prompt; None when there is nothing to compute (an echo of the prompt,
    max_tokens 0, with no logprobs or a single token that nothing predicts)."""
    score = scores_prompt(ids, s)
    if s.params.max_tokens == 0 and not score:
        return None
    params = scoring_params(s.params, s.vllm) if score else replace(s.params, logprob_start_len=-1)
    return GenerateRequest(rid=rid, input_ids=list(ids), params=params)


class CompletionRoutes:
    """The /v1/completions handler bound to one backend (router.py wires it)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def completions(self, body: CompletionBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda exchange: self._complete(body, exchange))

    async def _complete(self, body: CompletionBody, exchange: Exchange) -> Response:
        info = await served_model(self._backend, exchange, body.model)
        settings = validate_completion(body, info)
        check_causal(info, "/v1/completions")
        items = prompt_items(body.prompt)
        exchange.check_fan_out(len(items))  # counted from the body: before any text is tokenized
        ids_list = await self._ids(items, info)
        for i, ids in enumerate(ids_list):
            check_prompt(i if len(items) > 1 else None, ids, settings.params.max_tokens, info)

        cid = f"cmpl-{current_request_id() or uuid.uuid4().hex}"
        head = (cid, int(time.time()), info.model_name)
        # vLLM echoes an empty text with return_token_ids (the ids are the echo).
        choices = [ChoiceBuilder(i, ids, item if isinstance(item, str) and not settings.vllm.token_ids else "",
                                 settings.echo, settings.logprobs, settings.vllm)
                   for i, (item, ids) in enumerate(zip(items, ids_list, strict=True))]
        # Choice index -> worker request; an echo with nothing to compute sends none.
        requests = {i: req for i, ids in enumerate(ids_list)
                    if (req := prompt_request(f"{cid}-{i}", ids, settings)) is not None}
        if settings.vllm.prompt_logprobs is not None:  # its over-limit 400 names the field that asked
            check_limits(list(requests.values()), exchange.settings, info, param="prompt_logprobs")
        # The echoed text of prompts sent as ids is decoded while the worker answers.
        echoed = self._prompt_texts(choices, items, settings)
        if settings.stream:
            exchange.open(list(requests.values()), info)
            from_worker, _ = await all_or_none([exchange.first_chunks(), echoed])
        else:  # one unary worker call for every prompt (Exchange.answers)
            from_worker, _ = await all_or_none([exchange.answers(list(requests.values()), info), echoed])
        by_choice = dict(zip(requests, from_worker, strict=True))
        # Each choice's first chunk (streamed) or whole answer (not streamed).
        per_choice = [by_choice.get(i) or echo_only_chunk(f"{i}", len(c.prompt_ids)) for i, c in enumerate(choices)]
        if settings.stream:
            return exchange.stream(self._events(head, choices, per_choice, list(requests), exchange, settings))
        needed = set().union(*(c.needed_ids(w) for c, w in zip(choices, per_choice, strict=True)))
        texts = await token_texts(self._backend, needed)
        out = [c.delta(w, texts) for c, w in zip(choices, per_choice, strict=True)]
        return JSONAnswer(completion_json(*head, out, usage_json(choices)))

    async def _ids(self, items: list[str | list[int]], info: ModelInfo) -> list[list[int]]:
        """Each prompt's ids; the text ones tokenized here, in one thread call (ingress/text.py)."""
        texts = [item for item in items if isinstance(item, str)]
        for text in texts:
            check_text(text, info)
        encoded = iter(await self._backend.tokenize_many(texts) if texts else [])
        return [next(encoded) if isinstance(item, str) else list(item) for item in items]

    async def _prompt_texts(self, choices: list[ChoiceBuilder], items: list[str | list[int]],
                            settings: CompletionSettings) -> None:
        """What `echo` returns for prompts sent as ids: their decoded text (a text prompt echoes itself)."""
        if not settings.echo or settings.vllm.token_ids:
            return
        todo = [c for c, item in zip(choices, items, strict=True) if not isinstance(item, str)]
        if not todo:
            return
        # One tokenizer call for the whole batch (lm-eval sends 8 prompts as ids a request), not one per prompt.
        texts = await self._backend.detokenize_many([c.prompt_ids for c in todo])
        for c, text in zip(todo, texts, strict=True):
            c.prompt_text = text

    def _events(self, head: Head, choices: list[ChoiceBuilder], first_chunks: list[RequestOutput],
                choice_of: list[int], exchange: Exchange, settings: CompletionSettings) -> AsyncGenerator[str, None]:
        """Each prompt's chunks as OpenAI chunks (each names its choice `index`), then usage when asked for."""
        with_usage = settings.include_usage

        async def event(i: int, chunk: RequestOutput) -> str:
            texts = await token_texts(self._backend, choices[i].needed_ids(chunk))
            return sse_data(completion_json(*head, [choices[i].delta(chunk, texts)], with_usage=with_usage))

        def usage() -> str:
            return sse_data(completion_json(*head, [], usage_json(choices)))

        return openai_events(head[0], first_chunks, exchange, event, choice_of, usage if with_usage else None)
