"""Per-position candidate ids (on-policy distillation: the teacher's values of the student's own top-k, a different
list at each position) and input rows together with generated tokens in one request, against transformers: cold
and warm (prefix cache, hidden-state store), chunked, at a scoring temperature, mixed with other requests."""

from __future__ import annotations

import pytest
import torch

from engine.llm_engine import LLMEngine, RequestError
from protocol.sampling import SamplingParams
from tests.helpers.engine import assert_rows, make_engine, rand_ids
from tests.helpers.reference import hf_logits

ATOL = 1e-4


def candidates(rows: int, seed: int, k: int = 3) -> list[list[int]]:
    """A different list per row, of varying length (one row asks none)."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(0, 320, (1 + (r % k),), generator=g).tolist() for r in range(rows)]
    out[rows // 2] = []
    return out


def check_rows(out, path, ids: list[int], p: SamplingParams) -> None:  # noqa: ANN001
    """Input rows, per-row ids and (greedy) generated tokens against one transformers forward of prompt + output."""
    n, temp = p.logprob_start_len, p.score_temperature
    full = ids + out.new_token_ids
    logits = hf_logits(path, full)
    scaled = torch.log_softmax(logits / temp, -1)
    pos = torch.arange(n, len(ids) - 1)
    assert_rows(out.input_token_logprobs, ids, n, scaled[pos, torch.tensor(ids[n + 1:])].tolist(), ATOL)
    assert len(out.input_token_ids_logprobs) == len(pos)
    for row, q, want_ids in zip(out.input_token_ids_logprobs, pos.tolist(), p.token_id_rows, strict=True):
        assert [t for _, t in row] == want_ids
        assert all(abs(v - scaled[q, t].item()) <= ATOL for v, t in row)
    raw = torch.log_softmax(logits, -1)
    assert len(out.new_token_ids) == p.max_tokens
    for j, (v, t) in enumerate(out.output_token_logprobs or []):
        q = len(ids) - 1 + j
        assert t == int(logits[q].argmax()), "greedy tokens equal transformers' argmax"
        assert abs(v - raw[q, t].item()) <= ATOL


def per_row(start: int, ids: list[int], seed: int, max_tokens: int = 0, temp: float | None = None
            ) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, return_logprob=True,
                          logprob_start_len=start, input_logprob_temperature=temp,
                          token_id_rows=candidates(len(ids) - start - 1, seed))


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_per_row_ids_cold_warm_chunked(tiny_models, prefix_cache: bool) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=prefix_cache, max_num_batched_tokens=8)
    ctx = rand_ids(26, seed=21)
    cases = [(ctx + [5, 6, 7], per_row(0, ctx + [5, 6, 7], 1)),
             (ctx + [9, 4], per_row(11, ctx + [9, 4], 2, temp=0.7)),
             (ctx + [5, 6, 7], per_row(3, ctx + [5, 6, 7], 3, max_tokens=4)),
             (ctx + [8], SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=2,
                                        token_ids_logprob=[7, 3], top_logprobs_num=2))]
    for _ in range(2):  # cold, then warm
        outs = eng.generate([i for i, _ in cases], [p for _, p in cases], check=True)
        for (ids, p), out in zip(cases[:3], outs[:3], strict=True):
            check_rows(out, path, ids, p)
        assert all([t for _, t in row] == [7, 3] for row in outs[3].input_token_ids_logprobs)
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


def test_input_rows_with_generated_tokens(tiny_models) -> None:
    """max_tokens 4 and logprob_start_len 0 in one request: every input row and four greedy tokens, with and without
    the prefix cache holding the prompt already."""
    path = tiny_models["qwen2"]
    eng = make_engine(path, enable_prefix_cache=True)
    ids = rand_ids(19, seed=22)
    p = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, return_logprob=True, logprob_start_len=0,
                       token_id_rows=candidates(18, 4))
    for _ in range(2):
        out = eng.generate([ids], p, check=True)[0]
        check_rows(out, path, ids, p)
    assert out.cached_tokens > 0


def test_preempted_request_keeps_its_rows(tiny_models) -> None:
    """Too few KV blocks for both: one is preempted and recomputed; its per-row ids still line up."""
    path = tiny_models["llama"]
    eng = make_engine(path, num_kv_blocks=12, max_num_batched_tokens=8)
    a, b = rand_ids(21, seed=23), rand_ids(20, seed=24)
    pa, pb = per_row(0, a, 5, max_tokens=6), per_row(2, b, 6, max_tokens=6)
    outs = eng.generate([a, b], [pa, pb], check=True)
    check_rows(outs[0], path, a, pa)
    check_rows(outs[1], path, b, pb)
    assert eng.scheduler.num_preemptions > 0


def test_flat_ids_are_reported_at_generated_tokens_too(tiny_models) -> None:
    """SGLang's output_token_ids_logprobs: a flat token_ids_logprob with generation reports the ids at every
    generated token as well, from the sampling row's values."""
    path = tiny_models["llama"]
    eng = make_engine(path)
    ids = rand_ids(15, seed=26)
    asked = [7, 3, 300]
    p = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, return_logprob=True, logprob_start_len=2,
                       token_ids_logprob=asked)
    out = eng.generate([ids], p, check=True)[0]
    lp = torch.log_softmax(hf_logits(path, ids + out.new_token_ids), -1)
    assert len(out.output_token_ids_logprobs) == 5 and len(out.input_token_ids_logprobs) == 12
    for j, row in enumerate(out.output_token_ids_logprobs):
        assert [t for _, t in row] == asked
        assert all(abs(v - lp[len(ids) - 1 + j, t].item()) <= ATOL for v, t in row)
    assert p.logprob_entries(len(ids)) == (12 + 5) + (12 + 5) * 3


def test_wrong_number_of_lists_names_the_rows(tiny_models) -> None:
    eng: LLMEngine = make_engine(tiny_models["llama"])
    ids = rand_ids(10, seed=25)
    p = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=3, token_id_rows=[[1]] * 5)
    with pytest.raises(RequestError, match=r"has 5 lists, one per scored row, but the request scores 6 rows"):
        eng.add_request("r", ids, p)
    with pytest.raises(RequestError, match="entry 999 is out of range"):
        eng.add_request("r", ids, SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=3,
                                                 token_id_rows=[[1], [2], [3], [999], [5], [6]]))


def test_entries_count_each_rows_own_list() -> None:
    p = SamplingParams(max_tokens=2, return_logprob=True, logprob_start_len=1, top_logprobs_num=1,
                       token_id_rows=[[1, 2, 3], [], [4]])
    # 3 input rows + 2 generated, each (1 + k) entries, plus 3 + 0 + 1 candidate entries.
    assert p.logprob_entries(5) == 5 * 2 + 4


def test_warm_candidate_rows_need_no_vocabulary_projection(tiny_models) -> None:
    """A teacher row asking its own candidates at T = 1 with no top-k, at a cached position whose log-sum-exp is
    stored: one dot product per candidate minus that log-sum-exp, no [rows, vocab] projection, same values."""
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True)
    ids = rand_ids(33, seed=27)
    p = per_row(0, ids, 8)
    check_rows(eng.generate([ids], p, check=True)[0], path, ids, p)
    projected: list[int] = []
    head = eng.model.compute_logits
    eng.model.compute_logits = lambda h: (projected.append(h.shape[0]), head(h))[1]  # type: ignore[method-assign]
    warm = eng.generate([ids], p, check=True)[0]
    check_rows(warm, path, ids, p)
    assert warm.cached_tokens == 32 and sum(projected) == 0
