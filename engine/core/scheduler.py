"""Continuous batching: each step, one token per decoding request plus prefill chunks, within budgets.

A long prefill never takes the whole step while others wait: each request's chunk is first capped at
long_prefill_token_threshold, and the budget left after everyone had a turn goes back to the capped chunks,
fewest tokens left first. A request that arrives during a long prefill is computed in the next step (whole if
it fits the budget the long one leaves); a long prefill alone still fills the whole budget.

With a vision-language model a second budget bounds the vision tower: a chunk is cut before an image whose tower
has not run when the step's image budget cannot take it (image_budget.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.core.adapter_queue import AdapterQueue
from engine.core.image_budget import ImageBudget
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    seq: Sequence
    # First position computed in this step (= seq.num_computed_tokens when scheduled).
    start: int
    # Tokens computed in this step: positions start .. start + num_tokens - 1.
    num_tokens: int
    # A hybrid's state snapshots this chunk writes: (tokens into the chunk, snapshot row) (state_slots.py).
    snapshots: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    # In batch order: the model runner lays the tokens out flat in this order.
    chunks: list[ScheduledChunk] = field(default_factory=list)
    # Requests that lost their blocks this step and will be recomputed from scratch.
    preempted: list[Sequence] = field(default_factory=list)
    # Waiting requests whose LoRA adapter could not be loaded, and why: the engine ends them with that error.
    refused: list[tuple[Sequence, str]] = field(default_factory=list)
    # Patches of the images whose vision tower runs in this step (the runner encodes exactly these): at most the
    # image budget, or one image larger than it, alone.
    image_patches: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 hidden_state_store: bool = True, long_prefill_token_threshold: int | None = None,
                 adapters: AdapterQueue | None = None, max_image_patches: int | None = None) -> None:
        """adapters: which waiting requests may take a LoRA adapter's slot (None: no adapters served).
        max_image_patches: the image budget, vision-tower patches encoded and not yet consumed at once (None: a text
        model, no budget)."""
        self.kv = kv
        self.adapters = adapters
        self.hidden_state_store = hidden_state_store
        self.set_budget(max_num_batched_tokens, long_prefill_token_threshold, max_image_patches)
        self.max_num_seqs = max_num_seqs
        self.max_chunks = max_num_seqs  # this step's share (schedule's max_chunks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first: the newest is preempted first
        self.num_preemptions = 0  # since start: each one frees a request's blocks for a later recompute

    def set_budget(self, max_num_batched_tokens: int, long_prefill_token_threshold: int | None,
                   max_image_patches: int | None = None) -> None:
        """The step's token budget and a long prefill's first share; changed between steps (a worker's user_config):
        each step schedules from the counters alone, so a request mid-prefill goes on under the new budget."""
        self.max_num_batched_tokens = max_num_batched_tokens
        # A request's first share of a step; None: a quarter of the budget (EngineConfig's default).
        self.chunk_cap = long_prefill_token_threshold or max(1, max_num_batched_tokens // 4)
        self.images = ImageBudget(max_image_patches) if max_image_patches is not None else None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def live(self) -> list[Sequence]:
        return [*self.running, *self.waiting]

    def schedule(self, max_chunks: int | None = None) -> SchedulerOutput:
        """The next step. max_chunks: the most requests it takes (with several steps in flight, each takes its share
        so that the steps are alike); a request in a step still in flight (seq.in_flight) is skipped."""
        out = SchedulerOutput()
        self.max_chunks = max_chunks or self.max_num_seqs
        if self.kv.states is not None:
            self.kv.states.start_step()
        if self.images is not None:
            self.images.start_step(sum(seq.images.held_patches for seq in self.running if seq.images is not None))
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:  # a step that had to preempt admits nobody new
            budget = self._schedule_waiting(out, budget)
        self._extend_capped(out, budget)
        for chunk in out.chunks:  # once each chunk's length is final
            chunk.snapshots = self.kv.plan_snapshots(chunk.seq, chunk.start, chunk.num_tokens)
        out.image_patches = self._image_patches(out)
        return out

    def _fit_images(self, seq: Sequence, n: int, start: int | None = None) -> int:
        """n, or fewer tokens when the step's image budget cannot take an image they reach (image_budget.py)."""
        if self.images is None:
            return n
        return self.images.fit(seq.images, seq.num_computed_tokens if start is None else start, n)

    @staticmethod
    def _image_patches(out: SchedulerOutput) -> int:
        """Patches of the distinct images the step's chunks reach whose tower output is not held."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for c in out.chunks:
            if c.seq.images is not None:
                for i, _ in c.seq.images.needing_tower(c.start, c.num_tokens):
                    if (id(c.seq.images), i) not in seen:
                        seen.add((id(c.seq.images), i))
                        total += c.seq.images.images[i].num_patches
        return total

    def _first_share(self, seq: Sequence, budget: int) -> int:
        """Tokens a request gets before everyone else scheduled this step has had a turn."""
        return min(seq.num_tokens - seq.num_computed_tokens, budget, self.chunk_cap)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Running requests, oldest first: decodes and the next chunks of chunked prefills. When the KV cache is
        full, the newest running request is preempted, so a request that is scheduled is never preempted later
        in the same step. Returns the token budget left."""
        i = 0
        while i < len(self.running) and budget > 0 and len(out.chunks) < self.max_chunks:
            seq = self.running[i]
            n = self._fit_images(seq, self._first_share(seq, budget)) if not seq.in_flight else 0
            if n == 0:  # its next image waits for the image budget, or its previous step is not back yet
                i += 1
                continue
            while not self.kv.allocate(seq, n):
                # The newest request not in flight (seq itself at the latest): one in flight keeps its blocks.
                victim = next(s for s in reversed(self.running) if not s.in_flight)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    return budget  # seq preempted itself: nothing older is left to try
            self._add_chunk(out, seq, n)
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Waiting requests, first come first served, while the budgets and the KV cache allow; a request whose
        LoRA adapter cannot have a slot yet keeps its place and the ones behind it go on (adapter_queue.py).
        Returns the token budget left."""
        if self.adapters is not None:
            self.adapters.start_step()
        passed: list[Sequence] = []  # skipped this step, in order: back at the head of the queue afterwards
        try:
            while (self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
                   and len(out.chunks) < self.max_chunks):
                seq = self.waiting[0]
                if not self._adapter_admits(out, seq):
                    passed.append(self.waiting.popleft())
                    continue
                first = seq.scheduled_time is None
                if not seq.block_table:  # new, or preempted: start after its longest cached prefix
                    cached = self.kv.match_prefix(seq, self.reusable_prefix(seq), count=first)
                    if first:
                        seq.num_cached_tokens = cached
                # May be 0: a scoring request whose whole prompt is cached runs no layer at all.
                share = self._first_share(seq, budget)
                n = self._fit_images(seq, share)
                if (n == 0 < share) or not self.kv.allocate(seq, n):  # its first image waits, or the KV is full
                    self.kv.free(seq)  # don't sit on cached blocks while waiting (an adapter's slot it keeps)
                    seq.num_computed_tokens = 0
                    return budget
                self.waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                if first:
                    seq.scheduled_time = time.monotonic()
                self.running.append(seq)
                self._add_chunk(out, seq, n)
                budget -= n
            return budget
        finally:
            self.waiting.extendleft(reversed(passed))

    def _adapter_admits(self, out: SchedulerOutput, seq: Sequence) -> bool:
        if self.adapters is None:
            return True
        try:
            return self.adapters.admits(seq)
        except ValueError as exc:  # the adapter's files no longer load: the request ends with why (LLMEngine.step)
            out.refused.append((seq, str(exc)))
            return False

    def _extend_capped(self, out: SchedulerOutput, budget: int) -> None:
        """Give the budget left to the chunks cut at the cap, fewest tokens left first (ties: oldest first), so
        the requests nearest their end finish soonest; while the KV cache allows, never preempting for it. Their
        new full blocks are registered at once, like any scheduled block."""
        def left(c: ScheduledChunk) -> int:
            return c.seq.num_tokens - c.start - c.num_tokens

        for chunk in sorted(out.chunks, key=left):  # stable: batch order (oldest first) among equals
            if budget <= 0:
                return
            seq = chunk.seq
            extra = min(left(chunk), budget)
            if extra > 0:
                extra = self._fit_images(seq, chunk.num_tokens + extra, chunk.start) - chunk.num_tokens
            if extra <= 0 or not self.kv.allocate(seq, chunk.num_tokens + extra):
                continue
            chunk.num_tokens += extra
            self.kv.cache_full_blocks(seq, chunk.start + chunk.num_tokens)
            budget -= extra

    def _add_chunk(self, out: SchedulerOutput, seq: Sequence, num_tokens: int) -> None:
        out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, num_tokens))
        self.kv.cache_full_blocks(seq, seq.num_computed_tokens + num_tokens)

    def update(self, chunk: ScheduledChunk, num_scored_rows: int, sampled: int | None) -> None:
        """Record what the step computed for a chunk: its tokens, its scoring rows and the token sampled after
        it (None when the chunk does not end a generating request's context)."""
        seq = chunk.seq
        seq.num_computed_tokens += chunk.num_tokens
        if chunk.num_tokens:
            seq.state_from = None  # read by this chunk: its state is in its own slot now
        if seq.images is not None:
            seq.images.release(seq.num_computed_tokens)
        seq.num_scored_rows += num_scored_rows
        if sampled is not None:
            seq.token_ids.append(sampled)

    def reusable_prefix(self, seq: Sequence) -> int:
        """How many leading tokens may come from the prefix cache."""
        limit = seq.num_tokens
        if seq.generates:
            limit -= 1  # the last token is computed: its row samples the next one
        if seq.params.scores_input and not self.hidden_state_store:
            # Without stored hidden states a scoring row needs its position computed: reuse only before N.
            limit = min(limit, seq.params.logprob_start_len)
        if seq.pool_position is not None and not self.hidden_state_store:
            limit = min(limit, seq.pool_position)  # likewise, the pooled row is computed
        return max(0, limit)

    def retract_all(self) -> int:
        """Every running request gives back its KV blocks and waits first, in its order (paused generation; the
        engine has finished every step in flight first: LLMEngine.drain)."""
        assert not any(s.in_flight for s in self.running), "retract with a step in flight"
        seqs = list(self.running)
        for seq in reversed(seqs):
            self._preempt(seq)
        return len(seqs)

    def _preempt(self, seq: Sequence) -> None:
        """Free everything the request holds and queue it first for recompute. Produced scoring rows and
        generated tokens are kept: recompute covers prompt + generated tokens and skips rows already made."""
        self.num_preemptions += 1
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        if seq.images is not None:  # a waiting request holds no tower output: the budget counts running ones
            seq.images.release_all()
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        if seq.images is not None:
            seq.images.release_all()
        seq.status = SequenceStatus.FINISHED
        seq.finished_time = time.monotonic()
