"""Shared by the engine tests: engines on test checkpoints, request parameters, random prompts and the check of
scoring rows against transformers' values."""

from __future__ import annotations

import random
from pathlib import Path

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from protocol.sampling import SamplingParams

# Config values every make_engine takes unless the call overrides them: a test module re-runs shared checks on
# another path by setting one here (monkeypatch.setitem), e.g. attention_backend="varlen".
DEFAULTS: dict[str, object] = {}


def make_engine(path: Path | str, **overrides: object) -> LLMEngine:
    # Prefix cache off by default: these tests are about chunking and batching, and a warm cache would
    # skip the very computation they check. test_prefix_cache.py turns it on.
    cfg = dict(model=str(path), max_num_batched_tokens=64, num_kv_blocks=256, block_size=4,
               score_rows_per_block=8, enable_prefix_cache=False)
    cfg.update(DEFAULTS)
    cfg.update(overrides)
    return LLMEngine(EngineConfig(**cfg))  # type: ignore[arg-type]


def scoring(start: int, k: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=start, top_logprobs_num=k)


def greedy(n: int, logprobs: bool = True, k: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, return_logprob=logprobs,
                          top_logprobs_num=k)


def rand_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 320) for _ in range(n)]


def assert_rows(got: list, ids: list[int], start: int, expected: list[float], atol: float = 1e-4) -> None:
    """Scoring rows align to input_ids[start+1:] and match the expected logprobs within atol."""
    assert [t for _, t in got] == ids[start + 1:], "rows must align to input_ids[N+1:]"
    diff = max(abs(v - e) for (v, _), e in zip(got, expected, strict=True))
    assert diff <= atol, diff
