"""POST /v1/completions: OpenAI legacy completions over the same Backend as /generate.

`echo` + `logprobs` returns the prompt's logprobs (exact: the engine's scoring path, in the same request
that then generates) and the completion's; a batch of prompts runs as concurrent worker requests, one
choice each. As on /generate, every prompt's first chunk decides the HTTP status before any byte goes
out, errors after that are in-band (an `error` event, then [DONE]), and a client that goes away aborts
every request of its batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Iterable
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.disconnect import ClientGone, until_disconnect
from ingress.errors import WORKER_ENDED_EARLY, JSONAnswer, worker_failed
from ingress.openai_format import ChoiceBuilder, completion_json, echo_only_chunk, usage_json
from ingress.openai_schemas import CompletionBody
from ingress.openai_validation import (
    CompletionSettings,
    OpenAIRequestError,
    check_prompt,
    openai_error,
    prompt_items,
    server_error,
    to_request,
    validate_completion,
)
from ingress.request_record import current_request_id
from ingress.responses import SSE_DONE
from ingress.streaming import SSEResponse
from workers.protocol import FinishInfo, GenerateChunk, merge_chunks

logger = logging.getLogger(__name__)
T = TypeVar("T")
Stream = AsyncGenerator[GenerateChunk, None]
CLIENT_CLOSED_REQUEST = 499  # as in app.py


class _StreamEnded(Exception):
    """A stream that ended without its answer once bytes were out; `message` is for the client."""


class _WorkerError(Exception):
    """A worker's answer that ends the request before any byte went out (its HTTP error is `answer`)."""

    def __init__(self, answer: JSONAnswer) -> None:
        self.answer = answer


def _finish_error(finish: FinishInfo | None) -> JSONAnswer | None:
    """A worker's `error` finish: 4xx keeps its code and message (the client's fault), else a 5xx."""
    if finish is None or finish.type != "error":
        return None
    message = finish.message or "The worker failed to serve this request."
    if finish.code is not None and 400 <= finish.code < 500:
        return openai_error(message, finish.code, type_="invalid_request_error", param="prompt")
    code = finish.code if finish.code is not None and 500 <= finish.code < 600 else 500
    return openai_error(message, code, type_="server_error")


async def _all_or_none(aws: Iterable[Awaitable[T]]) -> list[T]:
    """gather, but when one fails (or we are cancelled) the others are cancelled and have unwound before
    this returns: no stream is left running inside a task nobody awaits."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class CompletionRoutes:
    """The /v1/completions handler bound to one backend (openai_routes.py wires it)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def completions(self, body: CompletionBody, request: Request) -> Response:
        try:
            info = await self._backend.model_info()
            settings = validate_completion(body, info)
            items = prompt_items(body.prompt)
            ids_list = await _all_or_none(self._ids(item) for item in items)
            for i, ids in enumerate(ids_list):
                check_prompt(i, ids, settings, info, batch=len(items) > 1)
        except OpenAIRequestError as exc:
            return exc.answer()
        except Exception as exc:
            logger.warning("worker failed before the completion started", exc_info=exc)
            return server_error(worker_failed(exc))

        cid = f"cmpl-{current_request_id() or uuid.uuid4().hex}"
        head = (cid, int(time.time()), info.model_name)
        choices = [ChoiceBuilder(i, ids, item if isinstance(item, str) else "", settings.echo, settings.logprobs)
                   for i, (item, ids) in enumerate(zip(items, ids_list, strict=True))]
        streams: dict[int, Stream] = {}
        for i, ids in enumerate(ids_list):
            req = to_request(f"{cid}-{i}", ids, settings)
            if req is not None:
                streams[i] = self._backend.stream(req)
        handed_off = False  # once the SSE response owns the streams, it closes them
        try:
            # As on /generate, every prompt's first chunk decides the status before any byte goes out.
            # The echoed text of prompts sent as ids is decoded meanwhile.
            firsts, _ = await until_disconnect(request.receive, _all_or_none(
                [self._firsts(streams, choices), self._prompt_texts(choices, items, settings)]))
            if settings.stream:
                handed_off = True
                events = self._events(head, choices, firsts, streams, settings)
                return SSEResponse(events, on_close=lambda: _close_all(streams))
            wholes = await until_disconnect(
                request.receive, _all_or_none(self._rest(streams.get(i), first) for i, first in enumerate(firsts)))
            texts = await until_disconnect(request.receive, self._texts(
                set().union(*(c.needed_ids(w) for c, w in zip(choices, wholes, strict=True)))))
            out = [c.delta(w, texts) for c, w in zip(choices, wholes, strict=True)]
            return JSONAnswer(completion_json(*head, out, usage_json(choices)))
        except _WorkerError as exc:
            return exc.answer
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as exc:
            logger.warning("worker failed before the completion's answer started, id=%s", cid, exc_info=exc)
            return server_error(worker_failed(exc))
        finally:
            if not handed_off:
                await _close_all(streams)

    async def _ids(self, item: str | list[int]) -> list[int]:
        return await self._backend.tokenize(item) if isinstance(item, str) else list(item)

    async def _firsts(self, streams: dict[int, Stream], choices: list[ChoiceBuilder]) -> list[GenerateChunk]:
        async def first(i: int) -> GenerateChunk:
            if i not in streams:
                return echo_only_chunk(f"{i}", len(choices[i].prompt_ids))
            chunk = await anext(streams[i], None)
            if chunk is None:
                raise _WorkerError(server_error(WORKER_ENDED_EARLY))
            if (answer := _finish_error(chunk.finish_reason)) is not None:
                raise _WorkerError(answer)
            return chunk

        return await _all_or_none(first(i) for i in range(len(choices)))

    async def _prompt_texts(self, choices: list[ChoiceBuilder], items: list[str | list[int]],
                            settings: CompletionSettings) -> None:
        """What `echo` returns for prompts sent as ids: their decoded text (a text prompt echoes itself)."""
        if not settings.echo:
            return
        todo = [c for c, item in zip(choices, items, strict=True) if not isinstance(item, str)]
        texts = await _all_or_none(self._backend.detokenize(c.prompt_ids) for c in todo)
        for c, text in zip(todo, texts, strict=True):
            c.prompt_text = text

    async def _rest(self, stream: Stream | None, first: GenerateChunk) -> GenerateChunk:
        chunks = [first]
        if stream is not None and not first.finished:
            async for chunk in stream:
                chunks.append(chunk)
                if chunk.finished:
                    break
        whole = merge_chunks(chunks)
        if not whole.finished:
            raise _WorkerError(server_error(WORKER_ENDED_EARLY))
        if (answer := _finish_error(whole.finish_reason)) is not None:
            raise _WorkerError(answer)
        return whole

    async def _texts(self, ids: set[int]) -> dict[int, str]:
        if not ids:
            return {}
        order = sorted(ids)
        return dict(zip(order, await self._backend.token_texts(order), strict=True))

    async def _events(self, head: tuple[str, int, str], choices: list[ChoiceBuilder], firsts: list[GenerateChunk],
                      streams: dict[int, Stream], settings: CompletionSettings) -> AsyncGenerator[str, None]:
        """Each prompt's chunks as OpenAI chunks, in arrival order (each names its choice `index`), then
        usage when asked for, then [DONE]. Once bytes are out, a failure is an in-band `error` event."""
        with_usage = settings.include_usage

        async def event(i: int, chunk: GenerateChunk) -> str:
            texts = await self._texts(choices[i].needed_ids(chunk))
            return _sse(completion_json(*head, [choices[i].delta(chunk, texts)], with_usage=with_usage))

        pending: dict[asyncio.Future, int] = {}
        try:
            for i, chunk in enumerate(firsts):
                yield await event(i, chunk)
                if not chunk.finished:
                    pending[asyncio.ensure_future(anext(streams[i], None))] = i
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = pending.pop(task)
                    chunk = task.result()
                    if chunk is None:
                        raise _StreamEnded(WORKER_ENDED_EARLY)
                    if chunk.finish_reason is not None and chunk.finish_reason.type == "error":
                        raise _StreamEnded(chunk.finish_reason.message or "The worker failed.")
                    yield await event(i, chunk)
                    if not chunk.finished:
                        pending[asyncio.ensure_future(anext(streams[i], None))] = i
            if with_usage:
                yield _sse(completion_json(*head, [], usage_json(choices)))
        except Exception as exc:  # CancelledError / GeneratorExit are BaseException: they pass through
            logger.warning("completion failed mid-stream, id=%s", head[0], exc_info=exc)
            message = str(exc) if isinstance(exc, _StreamEnded) else worker_failed(exc)
            yield _sse({"error": {"message": message, "type": "server_error", "param": None, "code": 500}})
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        yield SSE_DONE


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=True, separators=(',', ':'))}\n\n"


async def _close_all(streams: dict[int, Stream]) -> None:
    # Aborts every worker request whose final chunk was not seen (the Backend.stream contract).
    for stream in streams.values():
        await stream.aclose()
