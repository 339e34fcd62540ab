"""How many rows one scoring chunk holds (logprobs.score_rows: final norm + LM head + log-softmax + target, top-k
and token-id gathers in one pass per chunk), and the memory bound that follows.

A chunk's only tensor that grows with the whole vocabulary is its float32 logits (engine/runner/logit_buffer.py):
filled by the LM head (a non-float32 model's one HEAD_SLICE of columns at a time), then soft-capped, scaled and
turned into log-softmax values in place, and read by the target, top-k, token-id and rank gathers. Anything else
vocab-wide is made one slice of columns at a time. So scoring's extra memory is at most
rows x (vocab x BYTES_PER_LOGIT + SLICE_BYTES_PER_ROW), whatever the batch or the prompt length; batch-invariant
mode adds its log-softmax tiles (logprobs.ROW_TILE rows) at its fixed chunk size."""

from __future__ import annotations

import torch

from engine.config import CPU_SCORE_ROWS, EngineConfig
from engine.runner.logit_buffer import VOCAB_SLICE

# The float32 logits, which become the values in place: the one [rows, vocab] tensor of a chunk.
BYTES_PER_LOGIT = 4
# Per row, the most one slice of columns holds at once, 12 bytes a column of VOCAB_SLICE: the LM head's
# model-dtype slice (HEAD_SLICE = 4 x VOCAB_SLICE columns of 2 bytes: 8), or a sliced log-sum-exp's slice and its
# exponentials (8), or a rank's shifted slice, its comparison and that comparison cast for the count (4 + 1 + 4).
SLICE_BYTES_PER_ROW = 12 * VOCAB_SLICE
# Share of the memory free after the KV cache (and hidden-state store) that scoring chunks may take.
FREE_SHARE = 0.25
# Beyond this many rows the LM-head matmul is large enough to keep a GPU busy: more only costs memory.
MAX_SCORE_ROWS = 8192


def score_bytes(rows: int, vocab: int) -> int:
    """The most bytes a scoring chunk of `rows` rows allocates at once."""
    return rows * row_bytes(vocab)


def row_bytes(vocab: int) -> int:
    """The most bytes one row of a scoring chunk takes: its float32 logits and its share of a slice's temporaries
    (a vocabulary narrower than a slice is one slice)."""
    return vocab * BYTES_PER_LOGIT + SLICE_BYTES_PER_ROW * min(vocab, VOCAB_SLICE) // VOCAB_SLICE


def score_chunk_rows(config: EngineConfig, vocab: int, device: torch.device, free_bytes: int | None = None) -> int:
    """The config's rows when set; CPU_SCORE_ROWS on CPU and in batch-invariant mode (whose checked LM-head shapes
    are fixed); on CUDA, rows whose chunk fits in FREE_SHARE of the free memory (free_bytes: given, or
    torch.cuda.mem_get_info's), between 1 and MAX_SCORE_ROWS."""
    if config.score_rows_per_block is not None:
        return config.score_rows_per_block
    if config.batch_invariant or (device.type != "cuda" and free_bytes is None):
        return CPU_SCORE_ROWS
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    rows = int(free_bytes * FREE_SHARE) // row_bytes(vocab)
    return max(1, min(MAX_SCORE_ROWS, rows))
