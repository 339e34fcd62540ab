"""The engine worker: a Serve deployment whose every replica is one process owning one engine
(one GPU where there are GPUs), streaming each request's deltas back: the engine's own RequestOutputs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from ray import serve

from engine.async_engine import AsyncEngine
from engine.config import RUNTIME_FIELDS, EngineConfig
from engine.llm_engine import LLMEngine
from engine.multimodal.image_input import ImageInput
from protocol import (
    GenerateRequest,
    ModelInfo,
    RequestOutput,
    WorkerStats,
    merge_outputs,
    until_finished,
)
from protocol.info import model_info_version
from workers.adapter_registry import adapter_registry_actor
from workers.many import Tagged, merged
from workers.metrics import MetricsRefresher, WorkerMetrics, autoscaling_stats
from workers.ranks import RankGroup, end_replica
from workers.replica import replica_label
from workers.stats import worker_stats
from workers.weight_sync import WeightSync, registry_actor

log = logging.getLogger("ray.serve")


def _labels(hf_config: Any) -> dict[int, str]:
    """A classifier's id2label, label index -> name (transformers keeps int keys; a JSON config may give strings)."""
    return {int(k): str(v) for k, v in (getattr(hf_config, "id2label", None) or {}).items()}


def _vision_ids(hf_config: Any) -> dict[str, int]:
    """A vision-language checkpoint's placeholder ids (ModelInfo's), none for a text model."""
    if getattr(hf_config, "vision_config", None) is None:
        return {}
    names = ("image_token_id", "vision_start_token_id", "vision_end_token_id")
    return {n: int(getattr(hf_config, n)) for n in names if getattr(hf_config, n, None) is not None}


class EngineWorker:
    """Serve deployment body (bound with options in deploy/app.py). Methods called through a handle:
    `generate` (stream=True), `generate_many` (stream=True: several requests' deltas), `generate_whole` (unary: whole
    answers of several requests), `model_info`, `stats`, `check_adapter`, `adapters_registry` and `weights_registry`
    (the registries' actor handles); Serve calls
    `check_health` and `reconfigure` (user_config). It takes token ids and returns ids and logprobs: the text side
    is the ingress's (ingress/text.py), stop strings included (ingress/output/: it closes the call to stop)."""

    def __init__(self, engine_config: dict[str, Any], model_name: str | None = None,
                 weight_updates: bool = False) -> None:
        cfg = EngineConfig(**engine_config)
        # Ray sets OMP_NUM_THREADS=1 in actors with < 2 CPUs: take the thread count from the config.
        # A delta is finished in the engine thread (generate's `stamp`: three attributes, no copy), so a large one
        # never holds this replica's event loop, which must keep answering health checks, stats and other streams.
        # tensor_parallel_size or pipeline_parallel_size > 1: this replica is rank 0 and starts the others in its
        # placement group.
        self.ranks = RankGroup(engine_config) if cfg.world_size > 1 else None
        self.engine = (AsyncEngine(cfg) if self.ranks is None
                       else AsyncEngine(engine=LLMEngine(cfg, self.ranks.group), on_fatal=end_replica))
        eng = self.engine.engine
        self.info = ModelInfo(model_name=model_name or cfg.model, vocab_size=eng.vocab_size,
                              max_model_len=eng.max_model_len, logprobs_mode=cfg.logprobs_mode,
                              model_path=str(eng.model_path),
                              prompt_chars_per_token=cfg.max_prompt_chars_per_token,
                              kv_capacity_tokens=eng.kv.pool.num_blocks * cfg.block_size,
                              max_queued_requests=cfg.max_queued_requests, max_queued_tokens=cfg.max_queued_tokens,
                              max_top_logprobs=cfg.max_top_logprobs, max_logprob_entries=cfg.max_logprob_entries,
                              num_labels=eng.model.num_labels,
                              id2label=_labels(eng.hf_config) if eng.model.classifier else {},
                              problem_type=getattr(eng.hf_config, "problem_type", None),
                              **_vision_ids(eng.hf_config))
        self._info_weights = ""  # the weight version self.info.version was computed on (`_current_info`)
        self._base_config = cfg  # what `args` gave; user_config (reconfigure) is laid over it
        # Serve's model multiplexing of LoRA adapters: an LRU of max_loras adapter names per replica that Serve
        # reports to every router (the engine's own LRU of slots is the same size and loads on demand).
        # A plain function, not a bound method: Serve keeps its LRU as an attribute of what it wraps.
        async def hold_adapter(model_id: str) -> str:
            return model_id

        self._hold_adapter = serve.multiplexed(max_num_models_per_replica=cfg.max_loras)(hold_adapter)
        self._whole_calls = self._whole_requests = 0  # generate_whole's calls and the requests they held (stats)
        self._stream_calls = 0  # generate's and generate_many's calls (stats: worker calls per HTTP request)
        self.metrics = WorkerMetrics(self.info.model_name, replica_label())
        self._refresher = MetricsRefresher(self.metrics, self.engine.stats, eng.counters.drain_steps)
        # Weight updates (weight_sync.py): the recorded weights are loaded before this replica serves.
        self.weight_updates = weight_updates
        if weight_updates:
            WeightSync(self.engine, registry_actor(), replica_label()).start()
        log.info("rayscore worker ready: model=%s device=%s dtype=%s kv_blocks=%d pid=%d CUDA_VISIBLE_DEVICES=%s",
                 cfg.model, eng.device, cfg.dtype, eng.kv.pool.num_blocks, os.getpid(),
                 os.environ.get("CUDA_VISIBLE_DEVICES"))

    async def reconfigure(self, user_config: dict[str, Any] | None) -> None:
        """Serve's user_config (`deployments: [{name: EngineWorker, user_config: {...}}]` in the YAML): the engine's
        RUNTIME_FIELDS (engine/config.py) over what `args` gave, applied between two engine steps, no restart.
        Called after __init__ at every start too, so a replica started later runs on them. An unknown or invalid
        field raises ValueError (Serve reports the deploy failed; the engine keeps its settings)."""
        cfg = self._base_config.with_runtime(user_config)
        await asyncio.wrap_future(self.engine.reconfigure(cfg))
        # The ingress validates against these: every answer carries the info's version, and the ingress refreshes its
        # copy when it differs (ingress/transport/worker_client.py).
        self.info = dataclasses.replace(self.info, prompt_chars_per_token=cfg.max_prompt_chars_per_token,
                                        max_queued_requests=cfg.max_queued_requests,
                                        max_queued_tokens=cfg.max_queued_tokens,
                                        max_top_logprobs=cfg.max_top_logprobs,
                                        max_logprob_entries=cfg.max_logprob_entries)
        self._info_weights = ""  # a new version, whatever the weights
        log.info("rayscore worker runtime settings: %s", {f: getattr(cfg, f) for f in RUNTIME_FIELDS})

    async def generate(self, req: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """One request's deltas (the streaming handle call)."""
        self._stream_calls += 1
        async with contextlib.aclosing(self._generate(req)) as stream:
            async for chunk in stream:
                yield chunk

    async def generate_many(self, reqs: list[GenerateRequest]) -> AsyncIterator[Tagged]:
        """Several requests' deltas from one streaming call (a streamed HTTP request with several prompts: many.py),
        each message the deltas ready together, tagged with their request's position in `reqs`. Cancelling the call
        (client gone) aborts every request not yet finished."""
        self._stream_calls += 1
        async with contextlib.aclosing(merged([self._generate(req) for req in reqs])) as messages:
            async for message in messages:
                yield message

    async def _generate(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        ids = req.input_ids
        if ids is None:  # the ingress tokenizes every text (ingress/text.py): a caller that did not is a bug
            raise ValueError(f"request {req.rid!r} has no input_ids: the worker takes token ids only")
        # aclosing: when Serve cancels this call (client gone), the engine stream is closed at once, which
        # aborts the request and frees its KV blocks.
        params = req.params
        eng = self.engine.engine
        info_version = self._current_info().version
        model_id = serve.get_multiplexed_model_id()
        if model_id:  # a LoRA adapter's call: Serve records that this replica holds it (workers/router.py prefers it)
            await self._hold_adapter(model_id)

        temperature = params.input_logprob_temperature

        def stamp(out: RequestOutput) -> RequestOutput:  # in the engine thread, off this event loop
            """What only the worker knows, set on the engine's own delta: it crosses to the ingress as is (its
            rows are the engine's tuples; nothing is copied per delta). The weights are read per delta: the
            engine changes them only between requests."""
            self.metrics.on_output(params, out)
            out.input_logprob_temperature = temperature
            out.weight_version = eng.weight_version
            out.info_version = info_version
            return out

        # The ingress decoded and preprocessed the images; here their bytes only become tensors.
        images = [ImageInput.from_carrier(im) for im in req.images] if req.images else None
        async with contextlib.aclosing(self.engine.generate(req.rid, ids, params, stamp, req.group,
                                                            req.shared_tokens, images=images)) as stream:
            async for chunk in stream:
                yield chunk

    async def generate_whole(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        """Each request's whole answer (its deltas merged, the final chunk's totals), in order, from one unary call:
        a non-streamed answer needs no streaming call per prompt (each costs a generator on both sides of the handle
        and a message per delta: docs/performance.md). Cancelling the call (client gone) aborts every request
        not yet finished, as closing `generate`'s stream does."""
        self._whole_calls += 1
        self._whole_requests += len(reqs)
        tasks = [asyncio.ensure_future(self._whole(req)) for req in reqs]
        try:
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # one failed or we were cancelled: none is left running unawaited
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _whole(self, req: GenerateRequest) -> RequestOutput:
        chunks = await until_finished(self._generate(req))
        # A scoring request's answer is one chunk already: nothing to merge.
        return chunks[0] if len(chunks) == 1 else merge_outputs(chunks)

    async def model_info(self) -> ModelInfo:
        return self._current_info()

    def _current_info(self) -> ModelInfo:
        """self.info with its version on the weights served now (a weight update changes it between requests)."""
        weights = self.engine.engine.weight_version
        if weights != self._info_weights or not self.info.version:
            self.info = dataclasses.replace(self.info, version=model_info_version(self.info, weights))
            self._info_weights = weights
        return self.info

    async def check_adapter(self, name: str, path: str) -> str | None:
        """Why the adapter at `path` cannot be served (None: it can): read and checked against the model, in a
        thread (reading safetensors takes a while), not loaded."""
        lora = self.engine.engine.lora
        try:
            await asyncio.to_thread(lora.check, name, path)
        except ValueError as exc:
            return str(exc)
        return None

    async def adapters_registry(self) -> Any:
        """A fresh handle on the deployment's adapter registry actor (the ingress's way to it, as for weights)."""
        return await asyncio.to_thread(adapter_registry_actor)

    async def weights_registry(self) -> Any:
        """A fresh handle on the deployment's weight registry actor (the ingress's way to it: its name is Serve's,
        known inside this deployment only), or None with weight updates off."""
        return await asyncio.to_thread(registry_actor) if self.weight_updates else None

    async def stats(self) -> WorkerStats:
        return worker_stats(self.engine, self._whole_calls, self._whole_requests, self._stream_calls)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics hook: this worker's token load (workers/autoscaling.py)."""
        return autoscaling_stats(self.engine.stats())

    def check_health(self) -> None:
        # Serve replaces a replica whose health check raises: when the engine loop has died, or when it has
        # work and has not finished a step for stuck_engine_timeout_s (busy is fine, stuck is not).
        self.engine.check_health()
        if self.ranks is not None:  # a dead rank: Serve replaces the replica, and its placement group with it
            self.ranks.check()


EngineWorkerDeployment = serve.deployment(name="EngineWorker")(EngineWorker)

