"""What the ingress knows about one HTTP request once it is answered: its id, route, tokens, status, timings.

The request-id middleware (request_id.py) opens a record per request and puts it in a context variable;
`RecordingBackend` fills in what the worker streams back, whichever route asked. The access log line and
the ingress metrics (metrics.py) are both written from the finished record.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from ingress.backend import Backend
from protocol import GenerateRequest, ModelInfo, RequestOutput, SamplingParams


@dataclass
class RequestRecord:
    request_id: str
    method: str
    # The matched route's path template ("/generate"); "unmatched" when no route matched (a 404).
    route: str = "unmatched"
    started: float = field(default_factory=time.monotonic)
    status: int = 0
    model: str = ""
    kind: str = ""  # "scoring" (max_tokens 0), "generation", "classify", or "" when no worker request was made
    finish_reason: str = ""  # the last worker stream's finish type ("" when none finished)
    prompt_tokens: int = 0  # summed over the request's worker streams (a /v1/completions batch has several)
    completion_tokens: int = 0
    first_byte_s: float | None = None  # seconds from arrival to the first body byte sent
    latency_s: float | None = None  # seconds from arrival to the last body byte sent
    # Why the request was refused, when a route knows better than its status code (set by routes).
    reject_reason: str | None = None


_current: ContextVar[RequestRecord | None] = ContextVar("rayscore_request", default=None)


def current_request_id() -> str | None:
    """The request id of the HTTP request being served (X-Request-ID or a made one); None outside one."""
    record = _current.get()
    return record.request_id if record is not None else None


def bind(record: RequestRecord) -> Token:
    """Make `record` the current request's. Set in the middleware's task: the route and the tasks the response
    starts inherit the same (mutable) record."""
    return _current.set(record)


def unbind(token: Token) -> None:
    _current.reset(token)


class RecordingBackend:
    """A Backend that notes, in the current request's record, the model and the tokens of every worker
    stream and answer; everything else passes through to the wrapped backend unchanged."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def model_info(self) -> ModelInfo:
        info = await self._backend.model_info()
        if (record := _current.get()) is not None:
            record.model = info.model_name
        return info

    def stream(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        return self._recorded(req, self._backend.stream(req))

    def streams(self, reqs: list[GenerateRequest]) -> list[AsyncGenerator[RequestOutput, None]]:
        return [self._recorded(req, inner) for req, inner in zip(reqs, self._backend.streams(reqs), strict=True)]

    async def _recorded(self, req: GenerateRequest,
                        inner: AsyncGenerator[RequestOutput, None]) -> AsyncGenerator[RequestOutput, None]:
        record = _current.get()
        if record is not None:
            record.kind = _kind(req.params)
        try:
            async for chunk in inner:
                if record is not None and chunk.finished:
                    record.prompt_tokens += chunk.prompt_tokens
                    record.completion_tokens += chunk.completion_tokens
                    record.finish_reason = chunk.finish_reason.type if chunk.finish_reason else ""
                yield chunk
        finally:
            # Closing this stream must close (and so abort) the worker's, as Backend.stream promises.
            await inner.aclose()

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        record = _current.get()
        if record is not None:
            for req in reqs:
                record.kind = _kind(req.params)
        answers = await self._backend.answers(reqs)
        if record is not None:
            for whole in answers:
                if whole.finished:
                    record.prompt_tokens += whole.prompt_tokens
                    record.completion_tokens += whole.completion_tokens
                    record.finish_reason = whole.finish_reason.type if whole.finish_reason else ""
        return answers

    def __getattr__(self, name: str) -> Any:
        # ready, tokenize, detokenize, token_texts, tokenizer_info: nothing to record.
        return getattr(self._backend, name)


def _kind(params: SamplingParams) -> str:
    return "classify" if params.classify else "scoring" if params.max_tokens == 0 else "generation"
