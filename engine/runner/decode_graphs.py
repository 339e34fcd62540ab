"""Decode-only steps replayed from CUDA graphs, one per batch-size bucket (vLLM's and SGLang's scheme).

A step whose every request computes one token (decodes, and one-token prompts) runs the transformer from a graph
captured for the smallest bucket that holds it: its inputs are copied into static buffers, the rows past the real
ones are padding that attends one key of a scratch cache block (never in the block pool, so no request reads
what they write), and the real rows of the static output are the step's hidden states. Only the varlen backend
is captured: its kernel takes the whole step in one call with no host sync, and its max_seqlen_k is fixed at the
table's width so one graph serves every context length.

On CPU nothing is captured (capture=False): the same padded buffers run eagerly, which is how the tests check
that padding a batch to its bucket leaves the real rows' values as they are."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.layers.attention import AttentionMetadata, VarlenPagedAttention
from engine.layers.varlen import VarlenInputs

log = logging.getLogger(__name__)

# The model's forward: (input_ids [B], positions [B], meta) -> hidden [B, H].
Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def decode_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 16, then every 32 past 256: the padding a step pays is
    at most ~12% past 64 requests, and the graph count stays near 20 for max_num_seqs 256."""
    sizes, b = [], 1
    while b < 8:
        sizes.append(b)
        b *= 2
    step = 8
    while b < max_batch:
        sizes.append(b)
        b += step
        step = 16 if b >= 64 else step
        step = 32 if b >= 256 else step
    sizes.append(max_batch)
    return sorted(set(s for s in sizes if s <= max_batch))


class DecodeGraphs:
    def __init__(self, forward: Forward, backend: VarlenPagedAttention, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, max_batch: int, max_blocks: int, scratch_block: int, capture: bool) -> None:
        """max_blocks: width of the static block table (the longest context / block_size, rounded up);
        scratch_block: a cache block outside the pool, written and read by the padding rows only."""
        self.forward, self.backend = forward, backend
        self.buckets = decode_buckets(max_batch)
        self.max_blocks, self.block_size = max_blocks, backend.block_size
        self.scratch_block = scratch_block
        b = self.buckets[-1]
        self.input_ids = torch.zeros(b, dtype=torch.long, device=device)
        self.positions = torch.zeros(b, dtype=torch.long, device=device)
        self.slots = torch.zeros(b, dtype=torch.long, device=device)
        self.cu_seqlens_q = torch.arange(b + 1, dtype=torch.int32, device=device)  # one query per request
        self.seqused_k = torch.ones(b, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(b, max_blocks, dtype=torch.int32, device=device)
        # The table's rows reach the device from a pinned host copy (an asynchronous copy, no sync), and only the
        # rows that changed since the last step, only as wide as their blocks (the kernel reads no further):
        # rows holds what each device row has, the copy event when the staging buffer may be written again.
        self.host_table = torch.zeros(b, max_blocks, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.rows: list[list[int] | None] = [None] * b
        self.copied: torch.cuda.Event | None = None
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if capture:
            self._capture_all(hidden_size, dtype, device)

    def fits(self, meta: AttentionMetadata) -> bool:
        """A step of one token per request, no more requests than the largest bucket, contexts within the table."""
        most = self.max_blocks * self.block_size
        return (0 < len(meta.lens) <= self.buckets[-1] and all(n == 1 for n in meta.lens)
                and all(s + 1 <= most for s in meta.starts))

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The step's hidden states [n, H], from the bucket's graph (or, not captured, its padded eager run)."""
        n = len(meta.lens)
        b = self.bucket(n)
        self._fill(input_ids, positions, meta, n, b)
        if b in self.graphs:
            self.graphs[b].replay()
            return self.outputs[b][:n]
        return self._padded_forward(b)[:n]

    def _fill(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, n: int,
              b: int) -> None:
        """The step's inputs into the static buffers with no host sync: ids, positions and slots are on the
        device already; a decode's key count is its position + 1; the block table's changed rows come from the
        pinned staging copy."""
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(meta.slot_mapping)
        torch.add(self.positions[:n], 1, out=self.seqused_k[:n])
        self._fill_table(meta.block_tables, n, b)
        if b > n:  # padding: token 0 at position 0, one key in the scratch block
            self.input_ids[n:b] = 0
            self.positions[n:b] = 0
            self.slots[n:b] = self.scratch_block * self.block_size
            self.seqused_k[n:b] = 1

    def _fill_table(self, tables: list[list[int]], n: int, b: int) -> None:
        """Rows 0..n-1 take the step's tables, rows n..b-1 the scratch block; only rows that differ from what the
        device holds are staged and copied (one copy of the span from the first to the last changed row)."""
        want: list[list[int]] = [t[:self.max_blocks] for t in tables] + [[self.scratch_block]] * (b - n)
        changed = [i for i, t in enumerate(want) if self.rows[i] != t]
        if not changed:
            return
        if self.copied is not None:  # the last step's copy out of the staging buffer has long finished: no wait
            self.copied.synchronize()
        for i in changed:
            self.host_table[i, :len(want[i])] = torch.tensor(want[i], dtype=torch.int32)
            self.rows[i] = want[i]
        lo, hi = changed[0], changed[-1] + 1
        width = max(len(want[i]) for i in changed)
        self.block_table[lo:hi, :width].copy_(self.host_table[lo:hi, :width], non_blocking=True)
        if self.block_table.is_cuda:
            self.copied = torch.cuda.Event()
            self.copied.record()

    def _padded_forward(self, b: int) -> torch.Tensor:
        meta = AttentionMetadata(slot_mapping=self.slots[:b], starts=[], lens=[], context_slots=[])
        meta.plans[self.backend.name] = VarlenInputs(self.cu_seqlens_q[:b + 1], self.seqused_k[:b],
                                                     self.block_table[:b], 1, self.max_blocks * self.block_size)
        return self.forward(self.input_ids[:b], self.positions[:b], meta)

    @torch.inference_mode()  # as the steps that replay them: no autograd state recorded into the graphs
    def _capture_all(self, hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Largest bucket first, all in one memory pool, so the smaller graphs reuse the largest one's blocks."""
        pool = None
        self.block_table.fill_(self.scratch_block)
        self.host_table.fill_(self.scratch_block)
        self.rows = [[self.scratch_block] * self.max_blocks] * len(self.rows)
        self.slots.fill_(self.scratch_block * self.block_size)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (kernel selection, lazy init) outside the capture
                self._padded_forward(self.buckets[-1])
        torch.cuda.current_stream(device).wait_stream(stream)
        for b in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._padded_forward(b)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize(device)
        log.info("decode CUDA graphs captured for batch sizes %s", self.buckets)
