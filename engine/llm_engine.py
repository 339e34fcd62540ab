"""The engine: schedule -> execute -> update, plus request bookkeeping and a synchronous batch call."""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.adapter_queue import AdapterQueue
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.scheduler import ScheduledChunk, Scheduler
from engine.core.sequence import Sequence
from engine.core.state_slots import StateSlots
from engine.loading.default_model import resolve_model_path
from engine.loading.loader import eos_token_ids, load_model, load_tokenizer, resolve_device
from engine.loading.lora import LoraError
from engine.loading.sharded import load_sharded
from engine.multimodal.image_input import ImageInput
from engine.multimodal.request_images import RequestImages
from engine.output_state import OutputState
from engine.parallel.driver import TensorParallel
from engine.parallel.group import TPGroup
from engine.runner.lora import LoraManager
from engine.runner.model_runner import Launched, ModelRunner
from engine.runner.step_plan import ChunkResult
from engine.stats import EngineCounters, EngineStats, token_load
from protocol.outputs import DEFAULT_WEIGHT_VERSION, FinishReason, RequestOutput, merge_outputs
from protocol.sampling import SamplingParams
from rulebook import limits, pooling, rules


@dataclass
class _InFlight:
    """A step launched and not finished: the runner's half, its requests' generators, when it was scheduled."""

    launched: Launched
    generators: dict[str, torch.Generator]
    started: float


class RequestError(ValueError):
    """A request the engine cannot take (bad ids, too long, ...): the caller's fault, a 4xx."""


class LLMEngine:
    def __init__(self, config: EngineConfig, group: TPGroup | None = None) -> None:
        """group: with tensor_parallel_size x pipeline_parallel_size = N > 1, this process's place as world rank 0 of
        the N ranks (the other ranks run engine.parallel.follower.Follower)."""
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_path: Path = resolve_model_path(config.model, config.cache_dir)
        self.parallel: TensorParallel | None = None
        if config.world_size > 1:
            if group is None or not group.is_driver:
                raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} needs this engine to be rank 0 "
                                 f"of a process group of {config.world_size} ranks (with pipeline_parallel_size "
                                 f"{config.pipeline_parallel_size}: engine/parallel/)")
            self.device = group.device
            self.model, self.hf_config = load_sharded(config, group)
            self.parallel = TensorParallel(self.model, group)
        else:
            self.device = resolve_device(config.device)
            self.model, self.hf_config = load_model(self.model_path, config.dtype, self.device,
                                                     config.float32_head)
        self.tokenizer = load_tokenizer(self.model_path)
        text = self.hf_config.get_text_config()  # a vision-language config's decoder; any other config itself
        self.eos_ids = eos_token_ids(self.model_path, text, self.tokenizer)
        self.vocab_size: int = text.vocab_size
        self.max_model_len: int = config.max_model_len or text.max_position_embeddings
        limit = self.model.position_limit()
        if limit is not None and self.max_model_len > limit:
            if config.max_model_len:
                raise ValueError(f"max_model_len {config.max_model_len} exceeds the {limit} positions this model "
                                 "is served exactly up to (its RoPE scaling: LlamaForCausalLM.position_limit)")
            self.max_model_len = limit
        # kv_cache_bytes bounds every rank: with pipeline stages, the blocks are those the costliest stage fits.
        costs = self.model.stage_costs or [(self.model.kv_bytes_per_token(), self.model.state_bytes_per_slot())]
        num_blocks, states = self._cache_layout(config, [(config.block_size * kv, slot) for kv, slot in costs])
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_cache, states)
        # With tensor parallelism rank 0's manager sends each adapter load and eviction to the other ranks.
        self.lora = LoraManager(self.model, config, self.device, self.parallel)
        self.scheduler = Scheduler(self.kv, config.max_num_batched_tokens, config.max_num_seqs,
                                   hidden_state_store=config.hidden_state_store,
                                   long_prefill_token_threshold=config.long_prefill_token_threshold,
                                   adapters=AdapterQueue(self.lora), max_image_patches=self._image_budget(config))
        rows = states.running + states.num_snapshots if states is not None else 0
        self.runner = ModelRunner(self.model, config, self.device, num_blocks, self.parallel, self.lora,
                                  self.max_model_len, state_rows=rows)
        if self.parallel is not None:
            self.parallel.start(num_blocks, rows)
        # The served weights' name (SGLang's weight_version): set by each update (engine/loading/weight_update.py).
        self.weight_version = DEFAULT_WEIGHT_VERSION
        self.seqs: dict[str, Sequence] = {}
        # What each live request's stream has been sent (the scheduler and the runner never see it).
        self.output_states: dict[str, OutputState] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.num_finished = 0
        self.counters = EngineCounters()
        self._ids = itertools.count()
        # Pipeline overlap: up to `depth` steps launched and not yet finished, oldest first (step()).
        self.depth = config.pipeline_parallel_size if config.pipeline_overlap else 1
        self.in_flight: deque[_InFlight] = deque()
        self.peak_in_flight = 0  # the most steps ever in flight at once (1 without overlap)
        self._drained: list[RequestOutput] = []  # outputs of steps drained by flush_cache, for the next step()

    def _cache_layout(self, config: EngineConfig, costs: list[tuple[int, int]]) -> tuple[int, StateSlots | None]:
        """(KV blocks, a hybrid's state rows) from each pipeline stage's (bytes per KV block, state bytes per slot):
        the fewest blocks any stage's rank fits. A hybrid's running slots (max_num_seqs) come out of kv_cache_bytes
        first; its prefix-cache snapshots (one per hybrid_state_interval cached tokens) are charged per block."""
        if not self.model.hybrid:
            return config.num_kv_blocks or max(1, config.kv_cache_bytes // max(b for b, _ in costs)), None
        every = config.hybrid_state_interval if config.enable_prefix_cache else 0
        fits = []
        for per_block, slot in costs:
            running = config.max_num_seqs * slot
            if running >= config.kv_cache_bytes and not config.num_kv_blocks:
                raise ValueError(f"kv_cache_bytes {config.kv_cache_bytes} leaves no KV block beside the "
                                 f"{config.max_num_seqs} state slots of {type(self.model).__name__} ({running} bytes: "
                                 f"max_num_seqs x {slot}); raise kv_cache_bytes or lower max_num_seqs")
            block = per_block + (config.block_size * slot // every if every else 0)
            if block:  # a stage of linear layers only, without snapshots, holds nothing per block
                fits.append((config.kv_cache_bytes - running) // block)
        if not fits and not config.num_kv_blocks:
            raise ValueError("num_kv_blocks must be set: no layer holds anything per KV block (no full-attention "
                             "layer in layer_types, and no hybrid_state_interval snapshots)")
        num_blocks = config.num_kv_blocks or max(1, min(fits))
        return num_blocks, StateSlots(config.max_num_seqs, num_blocks * config.block_size // every if every else 0,
                                      every)

    # --- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    images: list[ImageInput] | None = None) -> None:
        """images: the request's images in prompt order; prompt_token_ids holds each one's placeholder run, expanded
        to its ImageInput.num_tokens (a vision-language model only)."""
        self._check(request_id, prompt_token_ids, params)
        seq = Sequence(request_id, prompt_token_ids, params)
        if images:
            seq.images = self._images(prompt_token_ids, images)
        if params.classify:
            seq.pool_position = pooling.pooled_position(prompt_token_ids, self.hf_config.get_text_config().pad_token_id)
        if params.adapter is not None:  # its slot is taken when the scheduler admits it (adapter_queue.py)
            self._join_adapter(params.adapter.name, params.adapter.path)
        self.seqs[request_id] = seq
        self.output_states[request_id] = OutputState(params)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        self.generators[request_id] = gen
        self.scheduler.add(seq)

    def _check(self, request_id: str, ids: list[int], p: SamplingParams) -> None:
        """The last line of defence: the ingress checks the same rules (rulebook/rules.py) before any work."""
        self._check_task(p)
        broken = (rules.request_id_in_use(request_id, request_id in self.seqs)
                  or rules.empty_ids(ids) or rules.token_out_of_range(ids, self.vocab_size)
                  or rules.negative_max_tokens(p.max_tokens)
                  or rules.context_too_long(len(ids), p.max_tokens, self.max_model_len)
                  or rules.logprobs_disabled(p.return_logprob, self.config.logprobs_mode)
                  or (rules.start_past_end(p.logprob_start_len, len(ids)) if p.scores_input else None)
                  or (rules.token_id_rows(p.token_id_rows, p.logprob_start_len, len(ids)) if p.scores_input
                      else None)
                  or (None if p.classify else rules.nothing_to_compute(p.max_tokens, p.scores_input)))
        if broken:
            raise RequestError(broken.message)
        fits = self.kv.blocks_for(len(ids) + p.max_tokens) <= self.kv.pool.num_blocks
        broken = (rules.kv_too_small(len(ids), p.max_tokens, self.kv.pool.num_blocks * self.config.block_size, fits)
                  or rules.negative_top_logprobs(p.top_logprobs_num) or rules.sampling_violation(p, self.vocab_size))
        if broken:
            raise RequestError(broken.message)
        self._check_limits(len(ids), p)

    def _images(self, ids: list[int], images: list[ImageInput]) -> RequestImages:
        if not self.model.multimodal:
            raise RequestError(f"model {type(self.model).__name__} takes no images; this request has {len(images)}")
        try:
            return RequestImages(ids, images, self.model.image_token_id)
        except ValueError as exc:
            raise RequestError(str(exc)) from exc

    def _join_adapter(self, name: str, path: str | None) -> None:
        if self.config.batch_invariant:
            raise RequestError("LoRA adapters are not served with batch_invariant.")
        try:
            self.lora.join(name, path)
        except LoraError as exc:
            raise RequestError(str(exc)) from exc

    def _check_task(self, p: SamplingParams) -> None:
        """A classifier answers classify requests only, and only a classifier answers them."""
        if self.model.classifier and not p.classify:
            raise RequestError(pooling.classifier_only(self.model.num_labels, "generation or token scoring").message)
        if p.classify and not self.model.classifier:
            raise RequestError(pooling.not_a_classifier("classify or pooling route").message)
        if p.classify and (p.max_tokens or p.scores_input or p.return_logprob):
            raise RequestError(pooling.CLASSIFY_FIELDS)

    def _check_limits(self, num_ids: int, p: SamplingParams) -> None:
        """What one request may cost (the ingress checks the same limits first; this is the worker's own guard)."""
        cfg = self.config
        broken = (limits.top_logprobs_over(p.top_logprobs_num, cfg.max_top_logprobs)
                  or limits.entries_over(p.logprob_entries(num_ids), cfg.max_logprob_entries))
        if broken:
            raise RequestError(broken.message)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Frees everything the request holds. Returns its final output, or None if it is not live."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return None
        seq.finish_reason = FinishReason("abort")
        self._finish(seq)
        return self._output(seq)

    def close(self) -> None:
        """Lets the other ranks of a tensor-parallel engine leave their loop (nothing to do on one device)."""
        if self.parallel is not None:
            self.drain()  # every stage's sends taken before Stop: a later stage leaves once its sends are done
            self.parallel.stop()
            self.parallel = None

    def apply_runtime(self, config: EngineConfig) -> None:
        """Take `config` (this engine's with other RUNTIME_FIELDS: EngineConfig.with_runtime) between two steps: the
        scheduler's budget here; the limits and timeouts are read from self.config where they are checked."""
        self.config = config
        self.scheduler.set_budget(config.max_num_batched_tokens, config.long_prefill_token_threshold,
                                  self._image_budget(config))

    def _image_budget(self, config: EngineConfig) -> int | None:
        """The scheduler's image budget: a vision-language model's (its default follows max_num_batched_tokens)."""
        return config.image_patch_budget if self.model.multimodal else None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.in_flight) or bool(self._drained)

    # --- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Launch steps until `depth` are in flight (or nothing is left to schedule), then finish the oldest one.

        With one step in flight (depth 1: one stage, or pipeline_overlap off) this is schedule, execute, update.
        With P pipeline stages and pipeline_overlap, each launch runs stage 0's layers and hands the step on; the
        next launch takes requests not in any step in flight (a request's counters move when its step comes back),
        so stage 0 runs step k + 1 while stage 1 runs step k, and rank 0 finishes step k (store, scoring rows,
        sampling) once it is back. Each step takes about 1/depth of the running requests, so the steps are alike.
        Steps finish in launch order, so every step sees the KV cache and stores of the earlier ones, as when
        they run one at a time: the rows are the same whatever the overlap."""
        outputs, self._drained = self._drained, []
        while len(self.in_flight) < self.depth:
            started = time.perf_counter()
            sched = self.scheduler.schedule(self._share())
            self.counters.on_schedule(sched)
            outputs.extend(self._refuse(seq, message) for seq, message in sched.refused)
            if not sched.chunks:
                break
            # Its requests' generators now: a request aborted meanwhile leaves, and its id may come back.
            generators = {c.seq.request_id: self.generators[c.seq.request_id] for c in sched.chunks}
            for chunk in sched.chunks:
                chunk.seq.in_flight = True
            self.in_flight.append(_InFlight(self.runner.launch(sched), generators, started))
            self.peak_in_flight = max(self.peak_in_flight, len(self.in_flight))
        if self.in_flight:
            outputs.extend(self._finish_oldest())
        return outputs

    def _share(self) -> int | None:
        """The most requests one step takes with several in flight: an even share of the live ones (None: any)."""
        if self.depth == 1:
            return None
        live = min(len(self.scheduler.running) + len(self.scheduler.waiting), self.config.max_num_seqs)
        return max(1, -(-live // self.depth))

    def _finish_oldest(self) -> list[RequestOutput]:
        step = self.in_flight.popleft()
        sched = step.launched.sched
        results = self.runner.finish(step.launched, step.generators)
        outputs = []
        for chunk, result in zip(sched.chunks, results, strict=True):
            chunk.seq.in_flight = False
            if chunk.seq.is_finished:
                continue  # aborted while its step was in flight: its blocks are gone, its answer sent
            out = self._update(chunk, result)
            if out is not None:
                outputs.append(out)
        self.counters.on_step(sched, time.perf_counter() - step.started)
        return outputs

    def drain(self) -> list[RequestOutput]:
        """Finish every step in flight (before what needs the requests at rest: a pause, a cache flush); their
        outputs, which the caller delivers."""
        outputs = []
        while self.in_flight:
            outputs.extend(self._finish_oldest())
        return outputs

    def _update(self, chunk: ScheduledChunk, r: ChunkResult) -> RequestOutput | None:
        seq = chunk.seq
        self.scheduler.update(chunk, len(r.score_logprobs), r.sampled)
        state = self.output_states[seq.request_id]
        state.add_input_rows(r.score_logprobs, r.score_top, r.score_token_ids, r.score_ranks)
        if r.pooled is not None:
            state.pooled = r.pooled
        if not seq.generates:
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                return None
            # Scoring ends with its prefill: nothing generated, nothing committed, never decodes.
            seq.finish_reason = FinishReason("length")
            self._finish(seq)
            return self._output(seq)
        if r.sampled is None:
            return None  # a prefill chunk that does not reach the end of the context
        state.add_sampled(r.sampled_logprob, r.sampled_top, r.sampled_token_ids, r.sampled_rank)
        seq.finish_reason = self._stop_reason(seq, r.sampled)
        if seq.finish_reason is not None:
            self._finish(seq)
        return self._output(seq)

    def _stop_reason(self, seq: Sequence, tok: int) -> FinishReason | None:
        """Why the request ends after the token just sampled, or None while it goes on. Stop strings are not the
        engine's: the text is made where the tokenizer lives (the ingress: ingress/output/detokenizer.py), which ends a
        request whose text matched one by aborting it."""
        p = seq.params
        if tok in p.stop_token_set or (not p.ignore_eos and tok in self.eos_ids):
            return FinishReason("stop", matched=tok)
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason("length")
        return None

    def _refuse(self, seq: Sequence, message: str) -> RequestOutput:
        seq.finish_reason = FinishReason("error", message=message, code=400)
        self._finish(seq)
        return self._output(seq)

    def _finish(self, seq: Sequence) -> None:
        if seq.params.adapter is not None:
            self.lora.leave(seq.params.adapter.name, pinned=seq.lora_slot is not None)
            seq.lora_slot = None
        self.scheduler.finish(seq)
        self.seqs.pop(seq.request_id, None)
        self.generators.pop(seq.request_id, None)
        self.num_finished += 1

    def _output(self, seq: Sequence) -> RequestOutput:
        """The delta since the previous output of this request (its last one, once it has finished)."""
        rid = seq.request_id
        state = self.output_states.pop(rid) if seq.is_finished else self.output_states[rid]
        return state.delta(seq)

    # --- synchronous batch call -----------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 check: bool = False, images: list[list[ImageInput] | None] | None = None) -> list[RequestOutput]:
        """Run the prompts to completion together; returns each one's merged answer, in order.
        check=True runs the block pool's integrity check after every step (for tests). images: each prompt's
        images (None or omitted: none)."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        rids = [f"batch-{next(self._ids)}" for _ in prompts]
        for rid, ids, p, imgs in zip(rids, prompts, plist, images or [None] * len(prompts), strict=True):
            self.add_request(rid, ids, p, imgs)
        streams: dict[str, list[RequestOutput]] = {rid: [] for rid in rids}
        while self.has_unfinished():
            for out in self.step():
                if out.request_id in streams:
                    streams[out.request_id].append(out)
            if check:
                self.check_integrity()
        return [merge_outputs(streams[rid]) for rid in rids]

    def flush_cache(self) -> None:
        """Empty the prefix cache, and with it what the hidden-state store and log-sum-exp store serve (both are
        read only at cached positions). Steps still in flight finish first (their outputs come with the next
        step; the worker drains and delivers them before it calls this)."""
        self._drained.extend(self.drain())
        self.kv.reset()
        self.runner.scorer.forget()

    def release_cached_memory(self) -> None:
        """Hand the CUDA caching allocator's unused blocks back to the driver (after a weight update's transient
        tensors); CPU has no such cache."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.scheduler.live())

    def stats(self) -> EngineStats:
        pool = self.kv.pool
        # list(): the worker reads this from another thread; copying a deque or list is atomic.
        queued, running = token_load(list(self.scheduler.waiting), list(self.scheduler.running))
        return EngineStats(
            waiting=len(self.scheduler.waiting), running=len(self.scheduler.running),
            kv_blocks_total=pool.num_blocks, kv_blocks_free=pool.num_free, kv_blocks_used=pool.num_used,
            requests_finished=self.num_finished, preemptions=self.scheduler.num_preemptions,
            prefix_cache_query_tokens=self.kv.stats.query_tokens, prefix_cache_hit_tokens=self.kv.stats.hit_tokens,
            prefix_cache_evictions=self.kv.stats.evictions, prefix_cache_blocks=len(self.kv.cached),
            queued_tokens=queued, running_tokens=running, steps=self.counters.steps,
            hidden_store_rows=self.counters.hidden_store_rows,
            vision_tower_runs=self.runner.vision.tower_runs if self.runner.vision is not None else 0)
