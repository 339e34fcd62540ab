"""POST /v1/chat/completions: OpenAI chat completions over the same request lifecycle as /generate.

The ingress renders the messages with the served tokenizer's chat template (the assistant's turn opened) and
tokenizes them (ingress/text.py); the prompt is then one worker request, as /v1/completions sends it, with the same
sampling rules, limits and error shapes. `logprobs` / `top_logprobs` come back as OpenAI's `logprobs.content[]`
(vLLM's `echo` only starts the answer's text with the last assistant message); with `stream`,
`chat.completion.chunk` events carry `delta`s (the first names the role), then usage when asked for, then [DONE].
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from starlette.responses import Response

from ingress.adapters.select import served_model
from ingress.backend import Backend
from ingress.edge.request_record import current_request_id
from ingress.errors import InvalidRequest, JSONAnswer, enforce
from ingress.images import ImageBlob, expanded, image_limits, vision_ids
from ingress.lifecycle import Exchange, Lifecycle
from ingress.limits import check_limits
from ingress.openai.render.chat import ChatChoice
from ingress.openai.render.common import completion_json, usage_json
from ingress.openai.render.stream import openai_events
from ingress.openai.schemas.chat import ChatBody, ChatMessage
from ingress.openai.validation import (
    VllmFields,
    check_fields,
    check_logprobs,
    check_prompt,
    include_usage,
    sampling_params,
    scoring_params,
    vllm_fields,
)
from ingress.output.token_texts import token_texts
from ingress.request_checks import check_causal
from ingress.sse import sse_data
from ingress.text import IMAGE_MARKER
from ingress.vllm.media import part_image
from protocol import ChatPrompt, GenerateRequest, ImageData, ModelInfo, RequestOutput, SamplingParams
from rulebook import images as img
from rulebook import openai as msg
from rulebook import vllm_media as vm

Head = tuple[str, int, str]  # id, created, model


@dataclass(frozen=True)
class ChatSettings:
    """A validated chat body's settings with OpenAI's defaults applied (null = default)."""

    messages: list[dict[str, Any]]  # as the chat template takes them, an image part as IMAGE_MARKER
    echo: str  # what the answer's content starts with (vLLM's chat echo): the last assistant message's text, or ""
    images: list[ImageBlob]  # the image parts' bytes, in order
    logprobs: int | None  # None: no logprobs; k >= 0: each token's own and k alternatives
    stream: bool
    include_usage: bool
    max_tokens: int | None  # None: up to the context length
    params: SamplingParams  # max_tokens is set per prompt (`max_tokens_for`)
    vllm: VllmFields

    def max_tokens_for(self, prompt_len: int, info: ModelInfo) -> int:
        # Without a limit, what the context and the worker's KV cache leave (OpenAI clients often omit the field;
        # a default the worker cannot hold would fail every such request). At least 1, so that a prompt filling
        # them is a 400.
        if self.max_tokens is not None:
            return self.max_tokens
        room = min(info.max_model_len, info.kv_capacity_tokens or info.max_model_len)
        return max(1, room - prompt_len)


def validate_chat(body: ChatBody, info: ModelInfo) -> ChatSettings:
    """Raise InvalidRequest for the first rule the body breaks (its `model` is served_model's to check); return its
    settings otherwise."""
    check_fields(body)
    messages, images = template_messages(body.messages)
    name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(msg.MAX_TOKENS_POSITIVE.format(name=name, value=max_tokens), param=name)
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest(msg.TOP_NEEDS_LOGPROBS, param="top_logprobs")
    k = (body.top_logprobs or 0) if body.logprobs else None
    check_logprobs(k, info, "logprobs" if body.top_logprobs is None else "top_logprobs")
    params = sampling_params(body, info, max_tokens or 1, k)
    return ChatSettings(messages=messages, echo=echo_text(body.messages) if body.echo else "", images=images,
                        logprobs=k, stream=bool(body.stream), include_usage=include_usage(body),
                        max_tokens=max_tokens, params=params, vllm=vllm_fields(body, info, params))


def template_messages(messages: list[ChatMessage]) -> tuple[list[dict[str, Any]], list[ImageBlob]]:
    """The messages as chat templates take them: role and text content (text parts joined by newlines, an image
    part as IMAGE_MARKER where it sits), and the name, tool calls and tool call id where the message has them; and
    the image parts' bytes in order (only data: URLs: rulebook/images.py)."""
    if not messages:
        raise InvalidRequest(msg.NO_MESSAGES, param="messages")
    out = []
    images: list[ImageBlob] = []
    for i, m in enumerate(messages):
        parts = [m.content] if isinstance(m.content, str) else list(m.content or [])
        content = ""
        after_text = False
        for j, part in enumerate(parts):
            if isinstance(part, str):
                content += ("\n" if after_text else "") + part
                after_text = True
                continue
            where = f"messages[{i}].content[{j}]"
            payloads = [key for key in vm.PAYLOAD_KINDS if getattr(part, key) is not None]
            kind = part.type or ("image_url" if part.image_url is not None else
                                 vm.PAYLOAD_KINDS[payloads[0]] if payloads else None)
            enforce(vm.media_part_violation(str(kind), where, "messages"))  # vLLM's media the server does not take
            if payloads:
                raise InvalidRequest(vm.STRAY_PAYLOAD.format(where=where, kind=img.quote(kind), key=payloads[0]),
                                     param="messages")
            if kind == "text" and part.text is not None:
                content += ("\n" if after_text else "") + part.text
                after_text = True
                continue
            if kind is None:
                raise InvalidRequest(vm.NO_TYPE.format(where=where), param="messages")
            if kind not in vm.IMAGE_PART_TYPES:
                raise InvalidRequest(msg.MESSAGE_PART.format(i=i, kind=kind), param="messages")
            if part.image_url is None and part.uuid is None:
                raise InvalidRequest(msg.IMAGE_PART.format(i=i), param="messages")
            images.append(part_image(part.image_url, part.uuid, f"messages[{i}] image {len(images)}", "messages"))
            content += IMAGE_MARKER
            after_text = False
        extra = {k: v for k in ("name", "tool_calls", "tool_call_id") if (v := getattr(m, k)) is not None}
        out.append({"role": m.role, "content": content, **extra})
    return out, images


def echo_text(messages: list[ChatMessage]) -> str:
    """vLLM's chat echo: the last message's text when it is the assistant's (the role the answer takes; the
    assistant's turn is always opened), its text parts joined by newlines; else nothing."""
    last = messages[-1]
    if last.role != "assistant" or last.content is None:
        return ""
    if isinstance(last.content, str):
        return last.content
    return "\n".join(p.text for p in last.content if p.type == "text" and p.text is not None)


class ChatRoutes:
    """The /v1/chat/completions handler bound to one backend (router.py wires it)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def chat(self, body: ChatBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda exchange: self._chat(body, exchange))

    async def _chat(self, body: ChatBody, exchange: Exchange) -> Response:
        info = await served_model(self._backend, exchange, body.model)
        settings = validate_chat(body, info)
        check_causal(info, "/v1/chat/completions")
        images: list[ImageData] = []
        if settings.images:
            enforce(img.no_images_here(len(settings.images), info.takes_images, "messages"))
            images = await self._backend.prepare_images(settings.images, image_limits(exchange.settings), "messages")
        prompt = await (self._backend.apply_chat_template(settings.messages, vision_ids(info)) if images
                        else self._backend.apply_chat_template(settings.messages))
        if prompt.error is not None:
            raise InvalidRequest(prompt.error, param="messages")
        ids = expanded(prompt.ids, images, info, "messages")
        max_tokens = settings.max_tokens_for(len(ids), info)
        if images:
            enforce(img.image_context(len(ids), [im.num_tokens for im in images], max_tokens, info.max_model_len,
                                      "messages"))
        check_prompt(None, ids, max_tokens, info, param="messages")
        prompt = ChatPrompt(ids)

        cid = f"chatcmpl-{current_request_id() or uuid.uuid4().hex}"
        head = (cid, int(time.time()), info.model_name)
        params = replace(settings.params, max_tokens=max_tokens)
        if settings.vllm.prompt_logprobs is not None and len(prompt.ids) >= 2:
            params = scoring_params(params, settings.vllm)
        requests = [GenerateRequest(rid=cid, input_ids=prompt.ids, params=params, images=images or None)]
        if settings.vllm.prompt_logprobs is not None:  # its over-limit 400 names the field that asked
            check_limits(requests, exchange.settings, info, param="prompt_logprobs")
        choice = ChatChoice(prompt.ids, settings.logprobs, settings.vllm, echo=settings.echo)
        if settings.stream:
            exchange.open(requests, info)
            first_chunks = await exchange.first_chunks()
            return exchange.stream(self._events(head, choice, first_chunks, exchange, settings.include_usage))
        (whole,) = await exchange.answers(requests, info)  # one unary worker call
        texts = await token_texts(self._backend, choice.needed_ids(whole))
        extra = choice.answer_fields(whole, texts)
        out = choice.render(whole, texts, stream=False)
        return JSONAnswer({**completion_json(*head, [out], usage_json([choice]), obj="chat.completion"), **extra})

    def _events(self, head: Head, choice: ChatChoice, first_chunks: list[RequestOutput], exchange: Exchange,
                with_usage: bool) -> AsyncGenerator[str, None]:
        async def event(_: int, chunk: RequestOutput) -> str:
            texts = await token_texts(self._backend, choice.needed_ids(chunk))
            extra = choice.answer_fields(chunk, texts)  # a stream has no prompt_logprobs (vLLM's rule)
            delta = choice.render(chunk, texts, stream=True)
            return sse_data({**completion_json(*head, [delta], with_usage=with_usage, obj="chat.completion.chunk"),
                             **extra})

        def usage() -> str:
            return sse_data(completion_json(*head, [], usage_json([choice]), obj="chat.completion.chunk"))

        return openai_events(head[0], first_chunks, exchange, event, [0], usage if with_usage else None)
