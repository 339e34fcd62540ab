"""One state object per request, owned by the scheduler; the model runner only reads it."""

from __future__ import annotations

import time
from enum import Enum

from engine.multimodal.request_images import RequestImages
from protocol.outputs import FinishReason
from protocol.sampling import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request's tokens and progress: scheduling state only. The scheduler writes it (LLMEngine sets the
    finish reason); the model runner only reads it. What the caller was sent lives in OutputState.

    Two counters and no phase: each step computes up to `num_tokens - num_computed_tokens` tokens.
    Prefill, chunked prefill, decode, recompute after preemption and prefix hits are the same rule.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float | None = None) -> None:
        self.request_id = request_id
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + generated
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # A hybrid model's per-request state slot (its linear layers' conv and recurrent state), held from the first
        # allocation of its blocks to their release (engine/core/kv_cache_manager.py); None: none held.
        self.state_slot: int | None = None
        # The prefix-cache snapshot row its state starts from at its first computed chunk (a hybrid's hit), until
        # that chunk is computed; None: from zeros at position 0, else from its own slot.
        self.state_from: int | None = None
        # Chained hashes of the full blocks at the head of block_table (the prefix cache's keys).
        self.block_hashes: list[int] = []
        self.status = SequenceStatus.WAITING
        # In a step launched and not yet finished (pipeline overlap, LLMEngine.step): its counters move when that
        # step comes back, so until then it is neither scheduled again nor preempted.
        self.in_flight = False
        self.finish_reason: FinishReason | None = None
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.scheduled_time: float | None = None
        self.finished_time: float | None = None
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache on first schedule
        # Scoring rows produced so far (kept across preemption: recompute skips them). The rows themselves
        # go to the caller through the engine's per-request OutputState.
        self.num_scored_rows = 0
        # A classify request's pooled position (transformers' last non-padding token), set by the engine.
        self.pool_position: int | None = None
        # A request with a LoRA adapter, from its admission to its end (engine/core/adapter_queue.py): its adapter's
        # slot in the step's layers, and the seed of its block hashes, so the prefix cache never gives one adapter's
        # (or the base's) blocks to another (None: the base model, or not admitted yet).
        self.lora_slot: int | None = None
        self.cache_salt: int | None = None
        # A request with images: their placeholder runs, M-RoPE positions and the vision tower's output (set by
        # the engine; None: text only).
        self.images: RequestImages | None = None

    # --- counters -------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def generates(self) -> bool:
        return self.params.max_tokens > 0

    @property
    def next_score_position(self) -> int:
        """The next input position whose row is still to be produced (row p scores token p+1)."""
        assert self.params.scores_input
        return self.params.logprob_start_len + self.num_scored_rows

    @property
    def last_score_position(self) -> int:
        return self.num_prompt_tokens - 2

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, status={self.status.value})")
