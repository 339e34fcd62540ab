"""How many rows one scoring chunk holds (logprobs.score_rows: final norm + LM head + log-softmax + target, top-k
and token-id gathers in one pass per chunk), and the memory bound that follows.

A chunk's vocab-wide buffers are its only ones that grow with the vocabulary; at any moment a row holds at most
BYTES_PER_LOGIT bytes per vocabulary entry in them: the LM head's logits, their float32 copy (the same tensor when
the model is float32) or the temperature-scaled copy, and the float32 values; with a final soft-cap, its two
temporaries in the model dtype before the copy. So scoring's extra memory is at most
rows x vocab x BYTES_PER_LOGIT, whatever the batch or the prompt length."""

from __future__ import annotations

import torch

from engine.config import CPU_SCORE_ROWS, EngineConfig

# 4 (float32 logits or their scaled copy) + 4 (float32 values) + 4 (the model-dtype logits, or a soft-cap
# temporary, while the float32 copy is made): a bound on every path of score_rows, float32 or bfloat16.
BYTES_PER_LOGIT = 12
# Share of the memory free after the KV cache (and hidden-state store) that scoring chunks may take.
FREE_SHARE = 0.25
# Beyond this many rows the LM-head matmul is large enough to keep a GPU busy: more only costs memory.
MAX_SCORE_ROWS = 8192


def score_bytes(rows: int, vocab: int) -> int:
    """The most bytes a scoring chunk of `rows` rows allocates at once."""
    return rows * vocab * BYTES_PER_LOGIT


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
    rows = int(free_bytes * FREE_SHARE) // (vocab * BYTES_PER_LOGIT)
    return max(1, min(MAX_SCORE_ROWS, rows))
