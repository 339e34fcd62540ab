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
        # Filled on the device from the step's rows of the planner's device table (step_plan.py): the step's
        # one host-to-device copy is the planner's.
        self.block_table = torch.zeros(b, max_blocks, dtype=torch.int32, device=device)
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
        """The step's inputs into the static buffers with no host sync: ids, positions, slots and the block table's
        rows are on the device already (the planner's); a decode's key count is its position + 1."""
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(meta.slot_mapping)
        torch.add(self.positions[:n], 1, out=self.seqused_k[:n])
        table = meta.plans[self.backend.name].block_table  # [n, widest table of the step]
        width = min(table.shape[1], self.max_blocks)
        # Columns past a row's pages keep older values: the kernel reads only the pages seqused_k covers.
        self.block_table[:n, :width].copy_(table[:, :width])
        if b > n:  # padding: token 0 at position 0, one key in the scratch block
            self.input_ids[n:b] = 0
            self.positions[n:b] = 0
            self.slots[n:b] = self.scratch_block * self.block_size
            self.seqused_k[n:b] = 1
            self.block_table[n:b, 0] = self.scratch_block

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
