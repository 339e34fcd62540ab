"""What the ingress needs from the workers, and its Ray Serve implementation.

The routes see only `Backend`, so unit tests inject a fake and run without Ray; `HandleBackend` is the
one real implementation, over the worker deployment's handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

from ingress.answer_text import AnswerText
from ingress.coalesce import Coalescer
from ingress.errors import Overloaded, WorkerLost, worker_failed
from ingress.images import ImageBlob, ImageLimits, ImageSide, prepare_images
from ingress.lazy import Lazy
from ingress.many_call import ManyCall
from ingress.tasks import all_or_none
from ingress.text import TextSide
from protocol import (
    DEFAULT_WEIGHT_VERSION,
    ChatPrompt,
    GenerateChunk,
    GenerateRequest,
    ImageData,
    ModelInfo,
    SamplingParams,
    TokenizerInfo,
    WeightUpdate,
    WeightUpdateResult,
    merge_outputs,
    until_finished,
)
from protocol.control import FlushCache, GenerationControl

if TYPE_CHECKING:  # Ray is only needed once a handle exists; tests of the routes never import it.
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger(__name__)

# How long an ingress replica trusts its copy of the adapter registry.
ADAPTERS_TTL_S = 1.0
# How long the ingress's copy of the workers' ModelInfo is trusted without an answer that confirms it (each answer
# carries the workers' version: one that differs starts a refresh at once); then a request starts a refresh in the
# background (no request waits for it). The default of IngressSettings.model_info_ttl_s.
MODEL_INFO_TTL_S = 60.0
WEIGHT_UPDATES_OFF = "Weight updates are off on this deployment (config field `weight_updates`)."
CONTROLS_OFF = ("Generation controls reach every worker through the weight registry, which is off on this deployment "
                "(config field `weight_updates`).")


class Backend(Protocol):
    async def model_info(self) -> ModelInfo:
        """The served model's limits; raises when no worker can answer."""
        ...

    def stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """An async generator of the request's deltas, ending after the chunk with finished=True. Each delta's text
        is the ingress's, decoded from its ids, and the answer ends at the first stop string (answer_text.py).

        Closing it (aclose) or cancelling the task that awaits it before the end must abort the
        request in the worker, so that a client that went away frees the engine's memory.
        A worker that died or vanished raises WorkerLost (the lifecycle may run the request again); a full
        queue raises Overloaded. So does every other method below.
        """
        ...

    def streams(self, reqs: list[GenerateRequest]) -> list[AsyncGenerator[GenerateChunk, None]]:
        """One stream per request, as `stream`'s, for the requests of one HTTP request (one admitted unit), read from
        one worker call where it can: closing any of them before its end may abort them all (a batch is read and
        closed as a whole)."""
        ...

    async def answers(self, reqs: list[GenerateRequest]) -> list[GenerateChunk]:
        """Each request's whole answer (its deltas merged), in order, from one call: what a non-streamed answer
        needs (a request with stop strings is read as its own stream, so the ingress can end it at a match). The
        answers are as the worker ended them (an `error` finish included; the caller checks).
        Cancelling the awaiting task aborts every request in the worker; errors are translated as in `stream`.
        """
        ...

    async def ready(self) -> bool:
        """True when at least one worker answers; never raises."""
        ...

    async def paused(self) -> str | None:
        """The pause mode a worker reports (a pause holds every replica), None while generating or when no worker
        answers; never raises."""
        ...

    # The served tokenizer (ingress/text.py: the ingress's own, loaded from the model folder; no worker call).
    # Each raises when no worker has told the model yet.
    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`text`'s ids; by default exactly as a text prompt of `generate` is tokenized."""
        ...

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        """`tokenize` of each of `texts` (no special tokens), from one call."""
        ...

    async def detokenize(self, ids: list[int]) -> str:
        """The text of in-vocabulary `ids`, special tokens included."""
        ...

    async def detokenize_many(self, prompts: list[list[int]]) -> list[str]:
        """`detokenize` of each of `prompts`, from one call."""
        ...

    async def token_texts(self, ids: list[int]) -> list[str]:
        """Each in-vocabulary id decoded alone."""
        ...

    async def apply_chat_template(self, messages: list[dict[str, Any]],
                                  image_ids: tuple[int, ...] = ()) -> ChatPrompt:
        """The ids of chat `messages` under the tokenizer's chat template, with the assistant turn opened; each
        IMAGE_MARKER in the rendered text becomes `image_ids` (vision start, one placeholder, vision end)."""
        ...

    async def prepare_images(self, blobs: list[ImageBlob], limits: ImageLimits, param: str) -> list[ImageData]:
        """The images decoded and preprocessed by this replica's image processor, in a thread; InvalidRequest names
        the first broken limit."""
        ...

    async def tokenizer_info(self) -> TokenizerInfo:
        ...

    # Weights (ingress/weights/routes.py): every worker replica, through the deployment's weight registry.
    async def update_weights(self, req: WeightUpdate) -> WeightUpdateResult:
        """Every replica loads req.model_path, or none does (success False, the reason in message)."""
        ...

    async def weight_version(self) -> str:
        ...

    # LoRA adapters (ingress/adapters/routes.py): the deployment's registry, name -> PEFT folder.
    async def adapters(self) -> dict[str, str]:
        ...

    async def load_adapter(self, name: str, path: str) -> str | None:
        """Check the adapter on a worker, then register it; the refusal's message, or None when loaded."""
        ...

    async def unload_adapter(self, name: str) -> bool:
        """False when no adapter has the name."""
        ...

    async def control(self, op: GenerationControl) -> WeightUpdateResult:
        """A control operation (protocol/control.py: Pause, Resume, Abort, FlushCache) on every worker replica,
        through the same registry. num_paused_requests: the requests touched."""
        ...


class HandleBackend:
    """Backend over the worker deployment: `generate` (streaming), `generate_many` (streaming, several requests),
    `generate_whole` (unary), `model_info` and `stats`; one worker call per HTTP request (the model-info refresh
    aside). The text side is this replica's own (ingress/text.py): the routes tokenize their prompts through it
    and the worker gets ids; the worker answers ids and logprobs, and the answer's text and its stop strings are
    made here (ingress/answer_text.py). Ray's errors for a lost replica become WorkerLost and Serve's
    BackPressureError becomes Overloaded (`_translated`)."""

    def __init__(self, worker: DeploymentHandle, ready_timeout_s: float = 5.0,
                 weight_updates: bool = False, coalesce_max_in_flight: int = 0,
                 coalesce_max_tokens: int = 2048, model_info_ttl_s: float | None = None) -> None:
        self._worker = worker
        self._info_ttl_s = MODEL_INFO_TTL_S if model_info_ttl_s is None else model_info_ttl_s
        self._adapters_cache: tuple[float, dict[str, str]] = (-1.0, {})
        # Concurrent short scoring calls merged into one worker call under load (coalesce.py).
        self.coalescer = Coalescer(self._whole_call, coalesce_max_in_flight, coalesce_max_tokens)
        # The worker deployment's weight registry: a deployment-scoped actor, reached through a worker (_registry).
        self._weight_updates = weight_updates
        self._stream_worker = worker.options(stream=True)
        self._ready_timeout_s = ready_timeout_s
        # Every replica serves the same model; the info's runtime limits follow the workers' user_config: every
        # answer carries the workers' version of it, and the copy is asked again when that differs, or after
        # model_info_ttl_s without an answer (`_seen`). _info_at: when the copy was last fetched or confirmed.
        self._info: ModelInfo | None = None
        self._info_at = 0.0
        self._info_refresh: asyncio.Task[None] | None = None
        self._text: Lazy[TextSide] = Lazy(TextSide)
        self._warming: asyncio.Task[None] | None = None
        self._images: Lazy[ImageSide] = Lazy(ImageSide)

    async def model_info(self) -> ModelInfo:
        if self._info is None:
            self._info, self._info_at = await _call(self._worker.model_info), time.monotonic()
        elif time.monotonic() - self._info_at > self._info_ttl_s:
            self._start_refresh()
        return self._info

    def _seen(self, chunk: GenerateChunk) -> None:
        """A worker's answer: its model-info version confirms the copy held (which is trusted for another TTL), or
        differs from it (a user_config change, a weight update) and starts a refresh."""
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
            self._info, self._info_at = await _call(self._worker.model_info), time.monotonic()
        except Exception as exc:  # noqa: BLE001  # no worker now: the copy held stays, the next call tries again
            logger.info("model_info refresh failed: %s", type(exc).__name__)
        finally:
            self._info_refresh = None

    async def _text_side(self) -> TextSide:
        info = await self.model_info()
        text = await self._text.get(info)
        # The runtime limits (prompt_chars_per_token) follow the refreshed ModelInfo; the tokenizer stays.
        text.info = info
        return text

    async def stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        response = None
        finished = False
        # The answer's text, made here from the ids (answer_text.py); built at the first generated ids, so a
        # scoring stream never needs the tokenizer.
        answer: AnswerText | None = None
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
                if answer is None and chunk.output_ids:
                    answer = AnswerText((await self._text_side()).tokenizer, req.params)
                if answer is not None:
                    chunk = answer.feed(chunk)
                if answer is not None and answer.stopped and not finished:
                    # A stop string ended the answer: the worker's request ends now (the abort path, below),
                    # before the client reads the last delta; what the engine generated past it is dropped.
                    self._cancel(response)
                    finished = True
                yield chunk
                if chunk.finished:
                    return
        except Exception as exc:
            raise _translated(exc) from exc
        finally:
            # Reached by aclose(), by cancellation of the consuming task (client gone) and by errors.
            if not finished and response is not None:
                self._cancel(response)

    def streams(self, reqs: list[GenerateRequest]) -> list[AsyncGenerator[GenerateChunk, None]]:
        """The requests without stop strings from one `generate_many` call (many_call.py); a request with stop strings
        keeps a call of its own (`stream`): the ingress ends it at a match by closing its call, and a call is closed
        as a whole, never one request in it."""
        together = [i for i, r in enumerate(reqs) if not r.params.stop_strings]
        if len(together) < 2:
            return [self.stream(r) for r in reqs]
        call = ManyCall([reqs[i] for i in together], self._many_call, self._tokenizer, _translated, self._cancel,
                        self._seen)
        members = iter(call.members())
        return [self.stream(r) if r.params.stop_strings else next(members) for r in reqs]

    def _many_call(self, reqs: list[GenerateRequest]) -> Any:
        return _multiplexed(self._stream_worker, reqs).generate_many.remote(reqs)

    async def _tokenizer(self) -> Any:
        return (await self._text_side()).tokenizer

    @staticmethod
    def _cancel(response: Any) -> None:
        """Cancelling the response cancels the replica's `generate` task: the worker sees asyncio.CancelledError at
        its current await and aborts the request in the engine, which frees its KV blocks."""
        # A call Serve refused, or whose replica died, has nothing left to cancel: its cancel() fetches the routing
        # result and re-raises that error, which must not replace the one raised in `stream`.
        with contextlib.suppress(Exception):
            response.cancel()

    async def answers(self, reqs: list[GenerateRequest]) -> list[GenerateChunk]:
        """A request with stop strings is read as a stream (one streaming call each), so that the ingress, which
        matches them, can end it in the worker when one matches; the others go as one unary call (coalesced)."""
        unary = [r for r in reqs if not r.params.stop_strings]
        streamed = [r for r in reqs if r.params.stop_strings]

        async def unary_answers() -> list[GenerateChunk]:
            return [await self._with_text(w, r.params) for w, r in
                    zip(await self.coalescer.answers(unary), unary, strict=True)] if unary else []

        async def read_whole(r: GenerateRequest) -> GenerateChunk:
            chunks = await until_finished(self.stream(r))
            return merge_outputs(chunks) if chunks else GenerateChunk(rid=r.rid)

        got = await all_or_none([unary_answers(), *(read_whole(r) for r in streamed)])
        by_unary, by_stream = iter(got[0]), iter(got[1:])
        return [next(by_stream if r.params.stop_strings else by_unary) for r in reqs]

    async def _with_text(self, whole: GenerateChunk, params: SamplingParams) -> GenerateChunk:
        """A whole answer with no stop strings, its text decoded here once."""
        if not whole.output_ids:
            return whole
        return AnswerText((await self._text_side()).tokenizer, params).feed(whole)

    async def _whole_call(self, reqs: list[GenerateRequest]) -> list[GenerateChunk]:
        # One unary call for all of them: a streaming call per prompt costs a generator on both sides of the
        # handle and a message per delta, several times the CPU of a short scoring request's own answer.
        response = None
        try:
            response = _multiplexed(self._worker, reqs).generate_whole.remote(reqs)
            answers: list[GenerateChunk] = await response
            for answer in answers:
                self._seen(answer)
            return answers
        except asyncio.CancelledError:
            # The client left (or the deadline passed): cancelling the call cancels the replica's task, which
            # aborts every request it had not finished.
            if response is not None:
                with contextlib.suppress(Exception):
                    response.cancel()
            raise
        except Exception as exc:
            raise _translated(exc) from exc

    async def paused(self) -> str | None:
        response = self._worker.stats.remote()
        try:
            stats = await asyncio.wait_for(_await(response), timeout=self._ready_timeout_s)
        except Exception:  # noqa: BLE001  # no answer: ready() reports that; the pause is unknown
            with contextlib.suppress(Exception):
                response.cancel()
            return None
        return getattr(stats, "paused", None)

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return await asyncio.to_thread((await self._text_side()).encode, text, add_special_tokens)

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        return await asyncio.to_thread((await self._text_side()).encode_many, texts)

    async def adapters(self) -> dict[str, str]:
        """The registry's adapters, read at most once a second per ingress replica (a load or unload through another
        replica shows here within that second)."""
        stamp, paths = self._adapters_cache
        if time.monotonic() - stamp < ADAPTERS_TTL_S:
            return paths
        registry = await self._adapter_registry()
        paths = await registry.all.remote() if registry is not None else {}
        self._adapters_cache = (time.monotonic(), paths)
        return paths

    async def load_adapter(self, name: str, path: str) -> str | None:
        registry = await self._adapter_registry()
        if registry is None:
            return "No worker replica has started: there is no adapter registry yet."
        refused: str | None = await _call(self._worker.check_adapter, name, path)
        if refused is not None:
            return refused
        if not await registry.put.remote(name, path):
            return f"The adapter {name!r} is already loaded (POST /v1/unload_lora_adapter first)."
        self._adapters_cache = (-1.0, {})
        return None

    async def unload_adapter(self, name: str) -> bool:
        registry = await self._adapter_registry()
        removed: bool = registry is not None and await registry.remove.remote(name)
        self._adapters_cache = (-1.0, {})
        return removed

    async def detokenize(self, ids: list[int]) -> str:
        return await asyncio.to_thread((await self._text_side()).decode, ids)

    async def detokenize_many(self, prompts: list[list[int]]) -> list[str]:
        return await asyncio.to_thread((await self._text_side()).decode_many, prompts)

    async def token_texts(self, ids: list[int]) -> list[str]:
        return await asyncio.to_thread((await self._text_side()).token_texts, ids)

    async def apply_chat_template(self, messages: list[dict[str, Any]],
                                  image_ids: tuple[int, ...] = ()) -> ChatPrompt:
        return await asyncio.to_thread((await self._text_side()).chat_prompt, messages, image_ids)

    async def prepare_images(self, blobs: list[ImageBlob], limits: ImageLimits, param: str) -> list[ImageData]:
        return await prepare_images(await self._images.get(await self.model_info()), blobs, limits, param)

    async def tokenizer_info(self) -> TokenizerInfo:
        return (await self._text_side()).tokenizer_info()

    async def update_weights(self, req: WeightUpdate) -> WeightUpdateResult:
        if not self._weight_updates:
            return WeightUpdateResult(False, WEIGHT_UPDATES_OFF)
        registry = await self._registry()
        if registry is None:
            return WeightUpdateResult(False, "No worker replica has started: there are no weights to update yet.")
        result: WeightUpdateResult = await registry.update.remote(req)
        return result

    async def control(self, op: GenerationControl) -> WeightUpdateResult:
        flush = isinstance(op, FlushCache)
        if not self._weight_updates:
            return WeightUpdateResult(False, WEIGHT_UPDATES_OFF if flush else CONTROLS_OFF)
        registry = await self._registry()
        if registry is None:
            return WeightUpdateResult(False, "No worker replica has started: there is no cache to flush." if flush
                                      else "No worker replica has started: there is no generation to control.")
        result: WeightUpdateResult = await registry.control.remote(op)
        return result

    async def weight_version(self) -> str:
        registry = await self._registry()
        if registry is None:
            return DEFAULT_WEIGHT_VERSION
        version: str = await registry.version.remote()
        return version

    async def _registry(self) -> Any:
        """The registry's actor handle, asked of a worker each time (its name is Serve's, per code version, and a
        handle held across Serve's recreation of the actor would point at the old one; the admin routes are rare);
        None with updates off or when no worker answers."""
        if not self._weight_updates:
            return None
        try:
            return await _call(self._worker.weights_registry)
        except Exception as exc:  # no worker, or the registry is being recreated
            logger.info("weight registry not reachable: %s", type(exc).__name__)
            return None

    async def _adapter_registry(self) -> Any:
        """The adapter registry's actor handle, asked of a worker as the weight registry's is; None when no worker
        answers."""
        try:
            return await _call(self._worker.adapters_registry)
        except Exception as exc:  # no worker, or the registry is being recreated
            logger.info("adapter registry not reachable: %s", type(exc).__name__)
            return None

    async def ready(self) -> bool:
        response = self._worker.stats.remote()
        try:
            await asyncio.wait_for(_await(response), timeout=self._ready_timeout_s)
        except Exception as exc:  # a dead, missing or busy worker all mean "not ready"
            with contextlib.suppress(Exception):
                response.cancel()
            logger.info("worker not ready: %s", type(exc).__name__)
            return False
        self.warm()
        return True

    def warm(self) -> None:
        """Load the tokenizer in the background once a worker can tell the model (a health probe, Serve's health
        check), not inside the first request, which would otherwise spend the load's seconds before any worker."""
        if not self._text.loaded and self._warming is None:
            self._warming = asyncio.create_task(self._warm_text(), context=contextvars.Context())  # as the refresh

    async def _warm_text(self) -> None:
        try:
            await self._text_side()
        except Exception as exc:  # noqa: BLE001  # the first request that needs the text side tries again
            logger.info("tokenizer warm-up failed: %s", type(exc).__name__)
        finally:
            self._warming = None


def _translated(exc: Exception) -> Exception:
    """Ray's error for a replica that died or became unreachable (RayActorError: ActorDiedError,
    ActorUnavailableError, also when a RayTaskError carries one) -> WorkerLost; Serve's BackPressureError
    (max_queued_requests) -> Overloaded with its Retry-After; anything else unchanged."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError

    cause = getattr(exc, "cause", None)
    if isinstance(exc, RayActorError) or isinstance(cause, RayActorError):
        return WorkerLost(worker_failed(exc))
    if isinstance(exc, BackPressureError):
        overloaded = Overloaded(f"The server is at capacity: {exc.message} Try again shortly "
                                "(config field `worker_max_queued_requests`).")
        if exc.retry_after_s is not None:
            # An instance refines its class's default (a ClassVar to mypy): Serve's own hint, in whole seconds.
            overloaded.retry_after_s = max(1, round(exc.retry_after_s))  # type: ignore[misc]
        return overloaded
    return exc


async def _call(method: Any, *args: Any) -> Any:
    """`method.remote(*args)`'s answer, Ray's errors translated (Serve may refuse at `.remote()` already)."""
    try:
        return await method.remote(*args)
    except Exception as exc:
        raise _translated(exc) from exc


async def _await(response: object) -> object:
    # asyncio.wait_for needs a coroutine or future; a DeploymentResponse is only awaitable.
    return await response  # type: ignore[misc]  # typed `object` here: Serve's response type is not imported


def _multiplexed(worker: DeploymentHandle, reqs: list[GenerateRequest]) -> DeploymentHandle:
    """The handle for a call whose requests share one LoRA adapter: Serve's model multiplexing routes it to a replica
    holding that adapter (a call mixing adapters, as coalescing may make, goes anywhere: every replica loads on
    demand)."""
    names = {r.params.adapter and r.params.adapter.name for r in reqs}
    if len(names) == 1 and (name := names.pop()) is not None:
        return worker.options(multiplexed_model_id=name)
    return worker
