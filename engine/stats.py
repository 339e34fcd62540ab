"""Engine counters for operators: what each step did, kept where the engine thread writes them and read by the
worker (which turns them into metrics). Plain Python: the engine imports neither Ray nor a metrics library."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.scheduler import SchedulerOutput

# Step records kept until the worker drains them (it does about once a second); older ones are dropped
# rather than grow without bound when nobody reads them.
MAX_PENDING_STEPS = 4096


@dataclass(frozen=True)
class StepRecord:
    duration_s: float  # schedule + execute + update, wall clock
    num_tokens: int  # tokens computed by the transformer in this step (prefill chunks + decodes)
    num_seqs: int  # requests in the step
    image_patches: int = 0  # vision-tower patches encoded in the step (a vision-language model's image budget)


@dataclass(frozen=True)
class EngineStats:
    """One reading of the engine, for the worker's health report, metrics and autoscaling (vLLM's
    SchedulerStats): plain ints, read from another thread without a lock (each is one atomic read)."""

    waiting: int  # requests in the scheduler's waiting queue
    running: int  # requests in the running batch
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_used: int
    requests_finished: int  # since start
    preemptions: int  # since start: requests whose KV blocks were freed, to be recomputed
    prefix_cache_query_tokens: int  # since start: prompt tokens looked up in the prefix cache
    prefix_cache_hit_tokens: int  # since start: prompt tokens served from it
    prefix_cache_evictions: int  # since start: cached blocks evicted for other content
    prefix_cache_blocks: int  # cached blocks now
    queued_tokens: int  # context tokens of the waiting requests, all still to compute (token_load)
    running_tokens: int  # context tokens of the running requests
    steps: int  # since start
    hidden_store_rows: int  # since start: scoring rows whose hidden state came from the store
    vision_tower_runs: int  # since start: images put through the vision tower (0 for a text model)


@dataclass(frozen=True)
class ServingStats(EngineStats):
    """The engine's reading with its admission queue in front (AsyncEngine.stats): `queued` requests accepted
    and not yet handed to the engine, `refused` since start as overloaded; `queued_tokens` is here the prompt
    tokens of those queued requests (what the autoscaler and the health report count as waiting work)."""

    queued: int
    refused: int


@dataclass
class EngineCounters:
    """Cumulative since the engine started; written only by the engine thread."""

    steps: int = 0
    # Scoring rows whose hidden state came from the hidden-state store (no transformer layer ran for them).
    hidden_store_rows: int = 0
    pending_steps: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_STEPS))

    def on_schedule(self, sched: SchedulerOutput) -> None:
        """Count what the scheduler decided; called before the step's outputs update the sequences."""
        self.hidden_store_rows += stored_rows(sched)

    def on_step(self, sched: SchedulerOutput, duration_s: float) -> None:
        self.steps += 1
        self.pending_steps.append(StepRecord(duration_s, sched.num_tokens, len(sched.chunks), sched.image_patches))

    def drain_steps(self) -> list[StepRecord]:
        """The step records since the last drain (safe from another thread: deque pops are atomic)."""
        out: list[StepRecord] = []
        while True:
            try:
                out.append(self.pending_steps.popleft())
            except IndexError:
                return out


def stored_rows(sched: SchedulerOutput) -> int:
    """Scoring rows of this step at positions before each chunk's start: the model runner reads their hidden
    states from the store (ModelRunner.finish: rows next_score_position .. last, `p < start`)."""
    n = 0
    for chunk in sched.chunks:
        seq = chunk.seq
        if not seq.params.scores_input:
            continue
        hi = min(seq.last_score_position, chunk.start + chunk.num_tokens - 1, chunk.start - 1)
        n += max(0, hi - seq.next_score_position + 1)
    return n


def token_load(waiting: list, running: list) -> tuple[int, int]:
    """(queued tokens, running tokens): the context (prompt + generated) of waiting requests, all of which is
    still to compute (a preempted request recomputes its whole context), and of running ones. Callers pass
    copies of the scheduler's queues."""
    return sum(s.num_tokens for s in waiting), sum(s.num_tokens for s in running)
