"""The engine on the embedded SmolLM2 equals transformers, whatever the chunking and the company."""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.helpers.engine import assert_rows, greedy, scoring
from tests.helpers.reference import hf_model, hf_scores


@pytest.fixture(scope="module")
def engine(smollm2_path) -> LLMEngine:
    # One model load for the module; the chunk budget is a scheduler knob changed between runs.
    return LLMEngine(EngineConfig(model=str(smollm2_path), num_kv_blocks=96, block_size=16,
                                  score_rows_per_block=32, enable_prefix_cache=False))


def ids_of(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 49152) for _ in range(n)]


@pytest.mark.parametrize("budget", [1, 3, 16, 64, 4096])
def test_scoring_any_chunk_budget(engine: LLMEngine, smollm2_path, budget: int) -> None:
    engine.scheduler.max_num_batched_tokens = budget
    ids = ids_of({1: 40, 3: 60}.get(budget, 150), budget)  # small budgets: one step per 1-3 tokens
    prompts = [ids, ids, ids]
    starts = [0, len(ids) // 2, len(ids) - 2]
    outs = engine.generate(prompts, [scoring(n) for n in starts], check=True)
    for n, out in zip(starts, outs, strict=True):
        assert_rows(out.input_token_logprobs, ids, n, hf_scores(smollm2_path, ids, n))
    assert engine.kv.pool.num_free == engine.kv.pool.num_blocks


def test_mixed_batch_with_generation(engine: LLMEngine, smollm2_path) -> None:
    engine.scheduler.max_num_batched_tokens = 64
    prompts = [ids_of(n, n) for n in (90, 17, 33, 120)]
    params = [scoring(0, k=2), greedy(10), scoring(16), greedy(6, k=3)]
    outs = engine.generate(prompts, params, check=True)
    ref = hf_model(str(smollm2_path))
    for ids, p, out in zip(prompts, params, outs, strict=True):
        if p.max_tokens == 0:
            assert_rows(out.input_token_logprobs, ids, p.logprob_start_len,
                        hf_scores(smollm2_path, ids, p.logprob_start_len))
        else:
            with torch.inference_mode():
                g = ref.generate(torch.tensor([ids]), max_new_tokens=p.max_tokens, do_sample=False,
                                 min_new_tokens=p.max_tokens, pad_token_id=2)
            assert out.new_token_ids == g[0, len(ids):].tolist()
