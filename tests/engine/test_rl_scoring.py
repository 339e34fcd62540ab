"""Scoring for RL and distillation: input rows at a temperature (log_softmax(logits / T)) and the values of given
token ids at every scored position equal transformers, cold and warm (prefix cache, hidden-state store and its
log-sum-exp shortcut, which holds T = 1 values only), in the default and the batch-invariant mode."""

from __future__ import annotations

import pytest
import torch

from engine.llm_engine import LLMEngine
from protocol.sampling import SamplingParams
from tests.helpers.engine import assert_rows, make_engine, rand_ids
from tests.helpers.reference import hf_logits

ATOL = 1e-4
LABELS = [7, 3, 300, 42]


def rl_scoring(start: int, temp: float | None = None, k: int = 0, token_ids: list[int] | None = None
               ) -> SamplingParams:
    return SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=start, top_logprobs_num=k,
                          input_logprob_temperature=temp, token_ids_logprob=token_ids)


def check(out, path, ids: list[int], p: SamplingParams, mode: str = "raw_logprobs") -> None:  # noqa: ANN001
    """Every row the request asked for against transformers' logits / T."""
    n, temp = p.logprob_start_len, p.score_temperature
    scaled = hf_logits(path, ids) / temp
    vals = torch.log_softmax(scaled, -1) if mode == "raw_logprobs" else scaled
    pos = torch.arange(n, len(ids) - 1)
    assert_rows(out.input_token_logprobs, ids, n, vals[pos, torch.tensor(ids[n + 1:])].tolist(), ATOL)
    if p.top_logprobs_num:
        assert len(out.input_top_logprobs) == len(pos)
        for row, q in zip(out.input_top_logprobs, pos.tolist(), strict=True):
            v, i = torch.topk(vals[q], p.top_logprobs_num)
            assert [t for _, t in row] == i.tolist()
            assert max(abs(a - b) for (a, _), b in zip(row, v.tolist(), strict=True)) <= ATOL
    else:
        assert out.input_top_logprobs is None
    if p.token_ids_logprob is not None:
        assert len(out.input_token_ids_logprobs) == len(pos)
        for row, q in zip(out.input_token_ids_logprobs, pos.tolist(), strict=True):
            assert [t for _, t in row] == p.token_ids_logprob
            want = vals[q, torch.tensor(p.token_ids_logprob, dtype=torch.long)].tolist() if row else []
            assert all(abs(a - b) <= ATOL for (a, _), b in zip(row, want, strict=True))
    else:
        assert out.input_token_ids_logprobs is None


def rounds(eng: LLMEngine, path, cases: list[tuple[list[int], SamplingParams]], mode: str = "raw_logprobs") -> None:  # noqa: ANN001
    for _ in range(2):  # cold, then warm
        outs = eng.generate([ids for ids, _ in cases], [p for _, p in cases], check=True)
        for (ids, p), out in zip(cases, outs, strict=True):
            check(out, path, ids, p, mode)
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_temperature_and_token_ids_cold_and_warm(tiny_models, family: str) -> None:
    """Requests at T = 1, 0.7 and 1.6 over one shared context, top-k and token ids mixed, chunked: the cached
    rows of a T = 1 request fill the log-sum-exp store, which the T != 1 requests at the same positions must not
    read (and must not overwrite)."""
    path = tiny_models[family]
    ctx = rand_ids(30, seed=3)
    cases = [(ctx + rand_ids(6, seed=4), rl_scoring(0)),
             (ctx + rand_ids(6, seed=4), rl_scoring(2, 0.7)),
             (ctx + rand_ids(5, seed=5), rl_scoring(1, 0.7, k=20)),
             (ctx + rand_ids(7, seed=6), rl_scoring(0, 1.6, token_ids=LABELS)),
             (ctx + rand_ids(3, seed=7), rl_scoring(4, token_ids=[])),
             (ctx + rand_ids(6, seed=4), rl_scoring(0, 1.0, k=3, token_ids=LABELS[:1]))]
    rounds(make_engine(path, enable_prefix_cache=True, max_num_batched_tokens=16), path, cases)


def test_warm_store_at_t1_then_other_temperature(tiny_models) -> None:
    """One request at a time: T = 1 (stores the log-sum-exp), then T = 0.7 over the same, now cached, positions
    with no top-k (the rows that would take the shortcut), then T = 1 again (the store was not overwritten)."""
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True)
    ids = rand_ids(41, seed=8)
    for p in (rl_scoring(0), rl_scoring(0, 0.7), rl_scoring(0), rl_scoring(3, 0.7, token_ids=LABELS)):
        out = eng.generate([ids], p, check=True)[0]
        check(out, path, ids, p)
    assert out.cached_tokens > 0


def test_raw_logits_mode_scales_the_logits(tiny_models) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True, logprobs_mode="raw_logits")
    ids = rand_ids(25, seed=9)
    rounds(eng, path, [(ids, rl_scoring(0)), (ids, rl_scoring(2, 0.5, k=4, token_ids=LABELS))], "raw_logits")


def test_batch_invariant_mode(tiny_models) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True, batch_invariant=True)
    ctx = rand_ids(33, seed=10)
    rounds(eng, path, [(ctx + [5, 6], rl_scoring(0)), (ctx + [9], rl_scoring(1, 0.7, k=20, token_ids=LABELS))])


def test_smollm2_teacher_rows(smollm2_path) -> None:
    """The issue's teacher request on the real model: T = 0.7, top-20, cold and warm."""
    eng = make_engine(smollm2_path, enable_prefix_cache=True, block_size=16, num_kv_blocks=32,
                      score_rows_per_block=32, max_num_batched_tokens=64)
    ids = rand_ids(90, seed=11)
    rounds(eng, smollm2_path, [(ids, rl_scoring(0)), (ids, rl_scoring(0, 0.7, k=20, token_ids=LABELS))])


def test_top_256_rows(tiny_models) -> None:
    """max_top_logprobs raised to 256: every row's 256 best, in order, at T = 1 and 0.7, rows in blocks of 8."""
    path = tiny_models["qwen2"]
    eng = make_engine(path, enable_prefix_cache=True, max_top_logprobs=256)
    ids = rand_ids(20, seed=12)
    rounds(eng, path, [(ids, rl_scoring(0, k=256)), (ids, rl_scoring(3, 0.7, k=256))])
