"""A step's plan: the scheduled chunks laid out flat (the transformer's input and attention metadata), which rows
score (and whether from this step's forward or from the hidden-state store), which sample, which pool, and which
run with which LoRA adapter. Pure bookkeeping on tensors of positions and slots: no model call.

The model runner (model_runner.py) executes the plan; its results come back per chunk as ChunkResult."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.scheduler import ScheduledChunk, SchedulerOutput
from engine.core.sequence import Sequence
from engine.layers.attention import AttentionMetadata, VarlenPagedAttention
from engine.layers.varlen import VarlenInputs
from engine.multimodal.request_images import RequestImages
from engine.runner.block_table import DeviceBlockTables
from protocol.outputs import TokenLogprob


@dataclass
class ChunkResult:
    # Scoring rows produced in this chunk, in position order (empty when none).
    score_logprobs: list[TokenLogprob]
    score_top: list[list[TokenLogprob] | None]
    # Per scoring row, the values of the request's token_ids_logprob (None where it asks none).
    score_token_ids: list[list[TokenLogprob] | None] = field(default_factory=list)
    # Per scoring row, its target's rank (None where the request does not ask).
    score_ranks: list[int | None] = field(default_factory=list)
    # The token sampled from the chunk's last row, when the chunk completes a generating request's context.
    sampled: int | None = None
    sampled_logprob: TokenLogprob | None = None
    sampled_top: list[TokenLogprob] | None = None
    # A classify request's raw scores at its pooled position, when the chunk completes its prompt.
    pooled: list[float] | None = None
    # The values of the request's token_ids_logprob at the sampled position (None: not asked).
    sampled_token_ids: list[TokenLogprob] | None = None
    # The sampled token's rank in its row (params.return_output_ranks; None: not asked).
    sampled_rank: int | None = None


@dataclass
class ChunkLayout:
    """Where one scheduled chunk sits in the step."""

    # The chunk's first row in the flat batch of new tokens.
    offset: int
    # The request's row of the device block table (block_table.py).
    row: int
    # Input positions whose scoring rows this step produces: score_lo .. score_hi (none when hi < lo).
    score_lo: int = 0
    score_hi: int = -1
    # The chunk ends a generating request's context: its last row samples the next token.
    samples: bool = False

    @property
    def num_score_rows(self) -> int:
        return max(0, self.score_hi - self.score_lo + 1)


@dataclass
class ScorePlan:
    """The step's scoring rows, chunk by chunk, each chunk's in position order (row p scores token p+1)."""

    # Rows per chunk, in batch order: how the results are handed back.
    counts: list[int] = field(default_factory=list)
    # [R] index of each row's hidden state: a row of the forward's output, or (a position cached before this
    # step) a row appended after them from the hidden-state store.
    rows: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)  # [R] the token each row scores
    top_k: list[int] = field(default_factory=list)  # [R] how many top tokens each row reports
    temps: list[float] = field(default_factory=list)  # [R] input_logprob_temperature of each row
    token_ids: list[list[int] | None] = field(default_factory=list)  # [R] token_ids_logprob of each row
    ranks: list[bool] = field(default_factory=list)  # [R] whether each row reports its target's rank
    slots: list[torch.Tensor] = field(default_factory=list)  # per chunk: [rows] KV slot of each scored position
    cached: list[bool] = field(default_factory=list)  # [R] position was computed before this step
    # Slots whose stored hidden state is appended after the forward's rows, in that order.
    stored: list[torch.Tensor] = field(default_factory=list)
    num_stored: int = 0


@dataclass
class StepPlan:
    # The transformer's input; None when every chunk of the step is served from the cache (no new token).
    input_ids: torch.Tensor | None  # [T]
    positions: torch.Tensor | None  # [T]
    meta: AttentionMetadata
    scores: ScorePlan
    # (row in the flat batch, chunk index) of each row that samples.
    sample_rows: list[tuple[int, int]]
    # (row in the flat batch or None, KV slot, chunk index) of each classify request's pooled position in this
    # step; None: the position was computed before this step, its hidden state is read from the store by slot.
    pool_rows: list[tuple[int | None, int, int]] = field(default_factory=list)
    # (LoRA adapter slot, first row, end row) runs of the flat batch (requests on the base model have none).
    lora_rows: list[tuple[int, int, int]] = field(default_factory=list)
    # (first row, the request's images, chunk start, chunk length) of each chunk of a request with images.
    image_chunks: list[tuple[int, RequestImages, int, int]] = field(default_factory=list)


class StepPlanner:
    """Plans a step for one runner: its device and block size, and whether its attention backend reads block tables
    (varlen: the kernel's inputs are laid out here, on the device) and the runner keeps a hidden-state store.

    The requests' block tables live on the device (block_table.py); a step sends the pages that changed and its
    token ids, positions and row indices in one copy, and every KV slot is computed on the device from them."""

    def __init__(self, device: torch.device, block_size: int, dtype: torch.dtype, reads_block_tables: bool,
                 has_store: bool, max_num_seqs: int = 1, context_slots: bool = False, mrope: bool = False) -> None:
        """context_slots: lay out each request's context slots even for a backend that reads block tables (the
        tensor-parallel followers attend with the torch path). mrope: the model's positions are [3, T] (time,
        height, width: engine/multimodal/positions.py), not [T]; the KV slots still follow the flat positions."""
        self.device = device
        self.mrope = mrope
        self.context_slots = context_slots or not reads_block_tables
        self.block_size = block_size
        self.dtype = dtype
        self.reads_block_tables = reads_block_tables
        self.has_store = has_store
        self.tables = DeviceBlockTables(device, max_num_seqs)

    def prepare(self, sched: SchedulerOutput) -> StepPlan:
        """Lay the chunks out flat in batch order; plan which rows score and which sample."""
        rows = self.tables.rows_for([c.seq for c in sched.chunks])
        ids: list[int] = []
        positions: list[int] = []
        token_rows: list[int] = []
        chunk_rows: list[int] = []
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), starts=[], lens=[], context_slots=[])
        layouts: list[ChunkLayout] = []
        lora_rows: list[tuple[int, int, int]] = []
        image_chunks: list[tuple[int, RequestImages, int, int]] = []
        rope_positions: list[torch.Tensor] = []
        offset = 0
        for chunk, row in zip(sched.chunks, rows, strict=True):
            layout = self._layout(chunk, offset, row)
            seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
            if n > 0:
                if seq.lora_slot is not None:
                    if lora_rows and lora_rows[-1][0] == seq.lora_slot and lora_rows[-1][2] == offset:
                        lora_rows[-1] = (seq.lora_slot, lora_rows[-1][1], offset + n)  # the same adapter goes on
                    else:
                        lora_rows.append((seq.lora_slot, offset, offset + n))
                ids.extend(seq.token_ids[start:start + n])
                positions.extend(range(start, start + n))
                token_rows.extend([row] * n)
                chunk_rows.append(row)
                if seq.images is not None:
                    image_chunks.append((offset, seq.images, start, n))
                if self.mrope:
                    rope_positions.append(self._rope_positions(seq, start, n))
                meta.starts.append(start)
                meta.lens.append(n)
                meta.block_tables.append(seq.block_table)
                if seq.state_slot is not None:
                    meta.state_slots.append(seq.state_slot)
                    from_row = seq.state_from if seq.state_from is not None else seq.state_slot
                    meta.state_sources.append(-1 if start == 0 else from_row)
                    meta.state_saves.append(chunk.snapshots)
            layouts.append(layout)
            offset += n
        used = [s + n for s, n in zip(meta.starts, meta.lens, strict=True)]
        cu = [0]
        for n in meta.lens:
            cu.append(cu[-1] + n)
        varlen = self.reads_block_tables and offset > 0
        d_ids, d_pos, d_rows, d_chunks, d_cu, d_used = self.tables.upload(
            [ids, positions, token_rows, chunk_rows if varlen else [], cu if varlen else [], used if varlen else []])
        if offset > 0:
            meta.slot_mapping = self._slots(d_rows, d_pos)
            if varlen:
                width = max(len(t) for t in meta.block_tables)
                meta.plans[VarlenPagedAttention.name] = VarlenInputs(
                    d_cu.to(torch.int32), d_used.to(torch.int32),
                    # [N, width]: only the step's widest table's columns gathered, contiguous as the kernels take it.
                    self.tables.table[:, :width].index_select(0, d_chunks), max(meta.lens), max(used))
            if self.context_slots:
                meta.context_slots = [self._range_slots(lay.row, c.start + c.num_tokens)
                                      for c, lay in zip(sched.chunks, layouts, strict=True) if c.num_tokens > 0]
            if not self.reads_block_tables:
                meta.finalize(self.device, self.dtype)
        scores = self._plan_scores(sched.chunks, layouts, offset)
        samples = [(lay.offset + c.num_tokens - 1, ci)
                   for ci, (c, lay) in enumerate(zip(sched.chunks, layouts, strict=True)) if lay.samples]
        model_positions = torch.cat(rope_positions, dim=-1) if self.mrope and offset else d_pos
        return StepPlan(d_ids if offset else None, model_positions if offset else None, meta, scores, samples,
                        self._plan_pools(sched.chunks, layouts, self.block_size), lora_rows, image_chunks)

    def _rope_positions(self, seq: Sequence, start: int, n: int) -> torch.Tensor:
        """[3, n] M-RoPE positions of tokens start .. start + n - 1 (a text-only request's three axes are equal)."""
        if seq.images is not None:
            return seq.images.positions(start, n).to(self.device)
        return torch.arange(start, start + n, device=self.device).expand(3, n)

    def _slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[N] the KV slot of each (table row, position) pair, read from the device table."""
        blocks = self.tables.table[rows, positions // self.block_size].long()
        return blocks * self.block_size + positions % self.block_size

    def _range_slots(self, row: int, hi: int, lo: int = 0) -> torch.Tensor:
        """[hi - lo] the KV slots of positions lo .. hi - 1 of the request on table row `row`."""
        pos = torch.arange(lo, hi, device=self.device)
        return self._slots(torch.full_like(pos, row), pos)

    @staticmethod
    def _plan_pools(chunks: list[ScheduledChunk], layouts: list[ChunkLayout],
                    block_size: int) -> list[tuple[int | None, int, int]]:
        """The pooled row of each classify request whose prompt this step completes (possibly with no new token:
        a prompt served whole from the prefix cache)."""
        rows: list[tuple[int | None, int, int]] = []
        for ci, (chunk, lay) in enumerate(zip(chunks, layouts, strict=True)):
            seq, pos = chunk.seq, chunk.seq.pool_position
            if pos is None or chunk.start + chunk.num_tokens != seq.num_prompt_tokens:
                continue
            fresh = lay.offset + pos - chunk.start if pos >= chunk.start else None
            rows.append((fresh, seq.block_table[pos // block_size] * block_size + pos % block_size, ci))
        return rows

    @staticmethod
    def _layout(chunk: ScheduledChunk, offset: int, row: int) -> ChunkLayout:
        seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
        layout = ChunkLayout(offset, row)
        if seq.params.scores_input:
            # Row p scores token p+1; rows already produced (before a preemption) are not redone.
            layout.score_lo = seq.next_score_position
            layout.score_hi = min(seq.last_score_position, start + n - 1)
        layout.samples = seq.generates and n > 0 and start + n == seq.num_tokens
        return layout

    def _plan_scores(self, chunks: list[ScheduledChunk], layouts: list[ChunkLayout], num_rows: int) -> ScorePlan:
        """num_rows: rows in the forward's output; rows read from the hidden-state store come after them."""
        plan = ScorePlan()
        for chunk, lay in zip(chunks, layouts, strict=True):
            count = lay.num_score_rows
            plan.counts.append(count)
            if count:
                self._plan_chunk_scores(plan, chunk.seq, chunk.start, lay, num_rows)
        return plan

    def _plan_chunk_scores(self, plan: ScorePlan, seq: Sequence, start: int, lay: ChunkLayout,
                           num_rows: int) -> None:
        lo, hi = lay.score_lo, lay.score_hi
        # Positions before `start` were computed in an earlier step (or come from the prefix cache): their
        # hidden states are in the store. They lead, since positions go in order.
        num_cached = max(0, min(hi + 1, start) - lo)
        if num_cached:
            assert self.has_store, "cached scoring row without a hidden store"
            first = num_rows + plan.num_stored
            plan.rows.extend(range(first, first + num_cached))
            plan.stored.append(self._range_slots(lay.row, lo + num_cached, lo))
            plan.num_stored += num_cached
        plan.rows.extend(range(lay.offset + lo + num_cached - start, lay.offset + hi + 1 - start))
        plan.targets.extend(seq.token_ids[lo + 1:hi + 2])
        plan.top_k.extend([seq.params.top_logprobs_num] * lay.num_score_rows)
        plan.temps.extend([seq.params.score_temperature] * lay.num_score_rows)
        plan.token_ids.extend(seq.params.row_token_ids(lo, hi))
        plan.ranks.extend([seq.params.return_input_ranks] * lay.num_score_rows)
        plan.slots.append(self._range_slots(lay.row, hi + 1, lo))
        plan.cached.extend([True] * num_cached + [False] * (lay.num_score_rows - num_cached))
