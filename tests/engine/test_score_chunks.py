"""Scoring in chunks of rows (engine/runner/score_chunks.py, logprobs.score_rows): the chunk size the engine takes,
that no LM-head call sees more rows than one chunk, and that the values do not depend on it."""

from __future__ import annotations

import pytest
import torch

from engine.config import CPU_SCORE_ROWS, EngineConfig
from engine.layers.linear import Linear
from engine.runner.logit_buffer import project_float32
from engine.runner.logprobs import score_rows
from engine.runner.score_chunks import (
    BYTES_PER_LOGIT,
    MAX_SCORE_ROWS,
    SLICE_BYTES_PER_ROW,
    score_bytes,
    score_chunk_rows,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_chunk_rows_from_config_device_and_free_memory() -> None:
    assert score_chunk_rows(EngineConfig(score_rows_per_block=40), 1000, CPU) == 40
    assert score_chunk_rows(EngineConfig(), 1000, CPU) == CPU_SCORE_ROWS
    # On CUDA: a quarter of the free memory over the bytes a row takes, clamped.
    vocab = 128_256
    free = 8 * 2 ** 30
    rows = score_chunk_rows(EngineConfig(), vocab, CUDA, free_bytes=free)
    assert rows == int(free * 0.25) // (vocab * BYTES_PER_LOGIT + SLICE_BYTES_PER_ROW) == 3_819
    assert score_bytes(rows, vocab) <= free * 0.25 < score_bytes(rows + 1, vocab)
    # The goal of docs/design/gpu.md: at most 0.6 GB per 1,024 rows at a 128k vocabulary.
    assert score_bytes(1024, vocab) <= 0.6e9
    assert score_chunk_rows(EngineConfig(), 1000, CUDA, free_bytes=10 ** 13) == MAX_SCORE_ROWS
    assert score_chunk_rows(EngineConfig(), vocab, CUDA, free_bytes=1000) == 1
    # Batch-invariant mode keeps the fixed size its checked shapes assume; the config still wins.
    assert score_chunk_rows(EngineConfig(batch_invariant=True), vocab, CUDA, free_bytes=free) == CPU_SCORE_ROWS
    assert score_chunk_rows(EngineConfig(score_rows_per_block=7), vocab, CUDA, free_bytes=free) == 7
    with pytest.raises(ValueError, match="score_rows_per_block"):
        EngineConfig(score_rows_per_block=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_do_not_follow_the_chunk_size_and_calls_stay_within_it(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    rows, hidden, vocab = 37, 16, 50
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(vocab, hidden, generator=g).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    ks = [i % 4 for i in range(rows)]
    temps = torch.tensor([1.0 if i % 3 else 0.7 for i in range(rows)])
    ids = [[3, 9] if i % 2 else None for i in range(rows)]
    seen: list[int] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return x @ w.T

    whole = score_rows(h, head, targets, ks, "raw_logprobs", rows, temps=temps, token_ids=ids)
    assert seen == [rows]
    for chunk in (1, 5, 16):
        seen.clear()
        got = score_rows(h, head, targets, ks, "raw_logprobs", chunk, temps=temps, token_ids=ids)
        assert max(seen) == chunk and sum(seen) == rows
        # Equal up to the matmul's own rounding, which follows its row count on CPU.
        assert _close(got.values, whole.values) and got.token_ids is not None
        assert all(_close(a or [], b or []) for a, b in zip(got.tops, whole.tops, strict=True))
        assert all(_close(a or [], b or []) for a, b in zip(got.token_ids, whole.token_ids, strict=True))
        assert torch.allclose(got.lse, whole.lse, atol=1e-5, rtol=0)
    # And they are the log-softmax of the scaled float32 logits.
    want = torch.log_softmax((h @ w.T).float() / temps[:, None], -1)
    assert max(abs(v - want[r, t].item()) for r, (v, t) in enumerate(whole.values)) < 1e-5


def _close(a: list[tuple[float, int]], b: list[tuple[float, int]]) -> bool:
    return [t for _, t in a] == [t for _, t in b] and all(abs(x - y) < 1e-5 for (x, _), (y, _) in zip(a, b,
                                                                                                     strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: peak memory of a scoring chunk")
def test_cuda_chunk_memory_within_the_bound() -> None:
    rows, hidden, vocab, chunk = 2048, 256, 128_256, 256
    h = torch.randn(rows, hidden, device=CUDA, dtype=torch.bfloat16)
    head = Linear(hidden, vocab, bias=False, device=CUDA, dtype=torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device=CUDA)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    # The scorer's head (logit_buffer.float_logits) past the final norm: a soft-capped bf16 LM head by slices.
    score_rows(h, lambda x: project_float32(x, head, 30.0), targets, [5] * rows, "raw_logprobs", chunk,
               temps=torch.full((rows,), 0.7, device=CUDA), ranks=[True] * rows)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base <= score_bytes(chunk, vocab) + 16 * 2 ** 20
