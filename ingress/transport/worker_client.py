"""The worker client: every call of a request to the worker deployment, and the model info the checks use.

`generate` (streaming) for a lone stream, `generate_many` (streaming, several requests) for a streamed HTTP request
of several prompts (many_call.py), `generate_whole` (unary) for the answers that are not streamed, merged under load
(coalesce.py): one worker call per HTTP request. The worker answers ids and logprobs; the answer's text and its stop
strings are made here, once per delta, by the output processor (ingress/output/). Ray's errors for a lost replica
become WorkerLost and Serve's BackPressureError becomes Overloaded (ray_calls.py).

The model info: every answer carries the workers' model-info version (protocol/info.py); the copy held here is asked
again only when an answer's differs (a user_config change, a weight update) or when no answer has come for
model_info_ttl_s, so while answers come the ingress makes no worker call of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from ingress.output.processor import OutputProcessor, Tokenizer
from ingress.tasks import all_or_none
from ingress.transport.coalesce import Coalescer
from ingress.transport.many_call import ManyCall
from ingress.transport.ray_calls import awaited, call, cancel, multiplexed, translated
from protocol import GenerateRequest, ModelInfo, RequestOutput, merge_outputs, until_finished

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger(__name__)

# How long the copy of the workers' ModelInfo is trusted without an answer that confirms it (each answer carries the
# workers' version: one that differs starts a refresh at once); then a request starts a refresh in the background (no
# request waits for it). The default of IngressSettings.model_info_ttl_s.
MODEL_INFO_TTL_S = 60.0


class WorkerClient:
    """Backend's request methods (model_info, stream, streams, answers, ready, paused) over the worker deployment's
    handle; `tokenizer` is the text side's, for the output processor."""

    def __init__(self, worker: DeploymentHandle, tokenizer: Tokenizer, ready_timeout_s: float = 5.0,
                 coalesce_max_in_flight: int = 0, coalesce_max_tokens: int = 2048,
                 model_info_ttl_s: float | None = None) -> None:
        self._worker = worker
        self._stream_worker = worker.options(stream=True)
        self._tokenizer = tokenizer
        self._ready_timeout_s = ready_timeout_s
        # Concurrent short scoring calls merged into one worker call under load (coalesce.py).
        self.coalescer = Coalescer(self._whole_call, coalesce_max_in_flight, coalesce_max_tokens)
        # Every replica serves the same model; the info's runtime limits follow the workers' user_config (`_seen`).
        # _info_at: when the copy was last fetched or confirmed by an answer.
        self._info_ttl_s = MODEL_INFO_TTL_S if model_info_ttl_s is None else model_info_ttl_s
        self._info: ModelInfo | None = None
        self._info_at = 0.0
        self._info_refresh: asyncio.Task[None] | None = None

    async def model_info(self) -> ModelInfo:
        """The served model's limits; raises when no worker can answer."""
        if self._info is None:
            self._info, self._info_at = await call(self._worker.model_info), time.monotonic()
        elif time.monotonic() - self._info_at > self._info_ttl_s:
            self._start_refresh()
        return self._info

    def _seen(self, chunk: RequestOutput) -> None:
        """A worker's answer: its model-info version confirms the copy held (trusted for another TTL), or differs
        from it and starts a refresh."""
        version = chunk.info_version
        if version is None or self._info is None:  # an answer made here, or a worker that tells no version
            return
        if version == self._info.version:
            self._info_at = time.monotonic()
        else:
            self._start_refresh()

    def _start_refresh(self) -> None:
        if self._info_refresh is None:
            # In an empty context, not the request's: the refresh is this replica's own traffic, so Serve files its
            # call under no route (its counters and logs tell it from the request's one call) and no request id.
            self._info_refresh = asyncio.create_task(self._refresh_info(), context=contextvars.Context())

    async def _refresh_info(self) -> None:
        try:
            self._info, self._info_at = await call(self._worker.model_info), time.monotonic()
        except Exception as exc:  # noqa: BLE001  # no worker now: the copy held stays, the next call tries again
            logger.info("model_info refresh failed: %s", type(exc).__name__)
        finally:
            self._info_refresh = None

    async def stream(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        """The request's deltas, ending after the chunk with finished=True, each through the output processor.

        Closing it (aclose) or cancelling the task that awaits it before the end aborts the request in the worker,
        so that a client that went away frees the engine's memory. A worker that died or vanished raises WorkerLost
        (the lifecycle may run the request again); a full queue raises Overloaded."""
        response = None
        finished = False
        output = OutputProcessor(req.params, self._tokenizer)
        try:
            # Inside the try: Serve's router may refuse the call right here (BackPressureError), not only on
            # the first read.
            handle = self._stream_worker
            if req.params.adapter is not None:
                handle = handle.options(multiplexed_model_id=req.params.adapter.name)
            response = handle.generate.remote(req)
            async for chunk in response:
                self._seen(chunk)
                finished = chunk.finished
                chunk = await output.feed(chunk)
                if output.stopped and not finished:
                    # A stop string ended the answer: the worker's request ends now (the abort path, below),
                    # before the client reads the last delta; what the engine generated past it is dropped.
                    cancel(response)
                    finished = True
                yield chunk
                if chunk.finished:
                    return
        except Exception as exc:
            raise translated(exc) from exc
        finally:
            # Reached by aclose(), by cancellation of the consuming task (client gone) and by errors.
            if not finished and response is not None:
                cancel(response)

    def streams(self, reqs: list[GenerateRequest]) -> list[AsyncGenerator[RequestOutput, None]]:
        """One stream per request, for the requests of one HTTP request: those without stop strings from one
        `generate_many` call (many_call.py; closing any of them before its end aborts them all); a request with stop
        strings keeps a call of its own (`stream`): the ingress ends it at a match by closing its call, and a call is
        closed as a whole, never one request in it."""
        together = [i for i, r in enumerate(reqs) if not r.params.stop_strings]
        if len(together) < 2:
            return [self.stream(r) for r in reqs]
        many = ManyCall([reqs[i] for i in together], self._many_call, self._tokenizer, self._seen)
        members = iter(many.members())
        return [self.stream(r) if r.params.stop_strings else next(members) for r in reqs]

    def _many_call(self, reqs: list[GenerateRequest]) -> Any:
        return multiplexed(self._stream_worker, reqs).generate_many.remote(reqs)

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        """Each request's whole answer (its deltas merged), in order, as the worker ended them (an `error` finish
        included; the caller checks). A request with stop strings is read as a stream (one streaming call each), so
        that the ingress, which matches them, can end it in the worker when one matches; the others go as one unary
        call (coalesced). Cancelling the awaiting task aborts every request in the worker."""
        unary = [r for r in reqs if not r.params.stop_strings]
        streamed = [r for r in reqs if r.params.stop_strings]

        async def unary_answers() -> list[RequestOutput]:
            answers = await self.coalescer.answers(unary) if unary else []
            return [await OutputProcessor(r.params, self._tokenizer).feed(w) for w, r in zip(answers, unary,
                                                                                              strict=True)]

        async def read_whole(r: GenerateRequest) -> RequestOutput:
            chunks = await until_finished(self.stream(r))
            return merge_outputs(chunks) if chunks else RequestOutput(request_id=r.rid)

        got = await all_or_none([unary_answers(), *(read_whole(r) for r in streamed)])
        by_unary, by_stream = iter(got[0]), iter(got[1:])
        return [next(by_stream if r.params.stop_strings else by_unary) for r in reqs]

    async def _whole_call(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        # One unary call for all of them: a streaming call per prompt costs a generator on both sides of the
        # handle and a message per delta, several times the CPU of a short scoring request's own answer.
        response = None
        try:
            response = multiplexed(self._worker, reqs).generate_whole.remote(reqs)
            answers: list[RequestOutput] = await response
            for answer in answers:
                self._seen(answer)
            return answers
        except asyncio.CancelledError:
            # The client left (or the deadline passed): cancelling the call cancels the replica's task, which
            # aborts every request it had not finished.
            if response is not None:
                cancel(response)
            raise
        except Exception as exc:
            raise translated(exc) from exc

    async def paused(self) -> str | None:
        """The pause mode a worker reports, None while generating or when no worker answers; never raises."""
        response = self._worker.stats.remote()
        try:
            stats = await asyncio.wait_for(awaited(response), timeout=self._ready_timeout_s)
        except Exception:  # noqa: BLE001  # no answer: ready() reports that; the pause is unknown
            cancel(response)
            return None
        return getattr(stats, "paused", None)

    async def ready(self) -> bool:
        """True when at least one worker answers; never raises."""
        response = self._worker.stats.remote()
        try:
            await asyncio.wait_for(awaited(response), timeout=self._ready_timeout_s)
        except Exception as exc:  # a dead, missing or busy worker all mean "not ready"
            cancel(response)
            logger.info("worker not ready: %s", type(exc).__name__)
            return False
        return True
