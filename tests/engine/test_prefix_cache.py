"""Prefix cache: hashing, sharing, LRU eviction, and scoring answers that do not depend on the cache."""

from __future__ import annotations

import random

import pytest
import torch

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence
from protocol.sampling import SamplingParams
from tests.helpers.engine import assert_rows, greedy, make_engine, rand_ids, scoring
from tests.helpers.reference import hf_logits, hf_scores

ATOL = 1e-4


def _seq(rid: str, ids: list[int]) -> Sequence:
    return Sequence(rid, ids, SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0))


def _fill(kv: KVCacheManager, seq: Sequence) -> None:
    """Pretend the whole prompt was computed and register its full blocks."""
    assert kv.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_full_blocks(seq, seq.num_tokens)


def test_chained_hash_shares_only_equal_prefixes() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _seq("a", list(range(10, 22)))  # 3 full blocks
    _fill(kv, a)
    b = _seq("b", list(range(10, 18)) + [99, 98, 97, 96])  # same 2 blocks, then different
    assert kv.match_prefix(b, b.num_tokens) == 8
    assert b.block_table == a.block_table[:2]
    assert kv.pool.ref_counts[a.block_table[0]] == 2
    c = _seq("c", [1, 2, 3, 4] + list(range(14, 22)))  # a's 2nd and 3rd blocks behind a different head
    assert kv.match_prefix(c, c.num_tokens) == 0
    kv.check_integrity([a, b, c])


def test_match_respects_limit() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _seq("a", list(range(10, 22)))
    _fill(kv, a)
    b = _seq("b", list(range(10, 22)))
    assert kv.match_prefix(b, 7) == 4  # only whole blocks inside the limit


def test_freed_blocks_stay_cached_and_evict_lru() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=2)
    old, new = _seq("old", [1, 2, 3, 4]), _seq("new", [5, 6, 7, 8])
    _fill(kv, old)
    _fill(kv, new)
    kv.free(old)
    kv.free(new)
    assert kv.pool.num_free == 4 and len(kv.cached) == 4
    # Two fresh blocks come from the never-used... none left: the least recently freed (old's) go first,
    # tail block before head block.
    x = _seq("x", [9, 9, 9, 9])
    assert kv.match_prefix(x, 4) == 0
    assert kv.allocate(x, 4)
    assert kv.stats.evictions == 2
    again_new = _seq("n2", [5, 6, 7, 8])
    assert kv.match_prefix(again_new, 4) == 4  # the recently freed prompt survived
    again_old = _seq("o2", [1, 2, 3, 4])
    assert kv.match_prefix(again_old, 4) == 0
    kv.check_integrity([x, again_new, again_old])


def test_eviction_never_touches_held_blocks() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=2)
    held = _seq("held", [1, 2, 3, 4])
    _fill(kv, held)
    y = _seq("y", [7, 7, 7, 7])
    assert not kv.allocate(y, 4)  # only one free block: all or nothing
    assert y.block_table == [] and kv.pool.num_free == 1
    assert kv.match_prefix(_seq("z", [1, 2, 3, 4]), 4) == 4


def _mc_items(n_ctx: int, ctx_len: int, end_len: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    items = []
    for c in range(n_ctx):
        ctx = rand_ids(ctx_len, seed * 100 + c)
        for _ in range(3):
            items.append((ctx + [rng.randrange(2, 320) for _ in range(end_len)], ctx_len - 1))
    return items


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_scoring_equal_cold_warm_evicted_store_off(tiny_models, family: str) -> None:
    path = tiny_models[family]
    items = _mc_items(n_ctx=3, ctx_len=22, end_len=6, seed=1)
    cases = [(ids, n) for ids, n in items] + [(ids, 0) for ids, _ in items] + [(ids, len(ids) - 2) for ids, _ in items]
    expected = [hf_scores(path, ids, n) for ids, n in cases]
    logits = [hf_logits(path, ids) for ids, _ in cases]
    # k = 2 on every third request, 0 elsewhere: k = 0 rows at cached positions take the log-sum-exp shortcut.
    ks = [2 if i % 3 == 0 else 0 for i in range(len(cases))]
    configs = {
        "store-on": dict(enable_prefix_cache=True),
        "store-off": dict(enable_prefix_cache=True, hidden_state_store=False),
        "evicting": dict(enable_prefix_cache=True, num_kv_blocks=14),  # 56 tokens: constant eviction
        "raw-logits": dict(enable_prefix_cache=True, logprobs_mode="raw_logits"),
    }
    for name, cfg in configs.items():
        eng = make_engine(path, max_num_batched_tokens=16, **cfg)
        for round_ in range(2):  # cold, then warm (or partly evicted)
            outs = eng.generate([ids for ids, _ in cases],
                                [scoring(n, k=k) for (_, n), k in zip(cases, ks, strict=True)], check=True)
            for (ids, n), out, exp, lg, k in zip(cases, outs, expected, logits, ks, strict=True):
                if name == "raw-logits":
                    exp = lg[torch.arange(n, len(ids) - 1), torch.tensor(ids[n + 1:])].tolist()
                assert_rows(out.input_token_logprobs, ids, n, exp)
                if k:
                    vals = lg if name == "raw-logits" else torch.log_softmax(lg, -1)
                    for row, pos in zip(out.input_top_logprobs, range(n, len(ids) - 1), strict=True):
                        assert [t for _, t in row] == torch.topk(vals[pos], k).indices.tolist()
            if round_ == 1 and name != "evicting":
                assert sum(o.cached_tokens for o in outs) > 0, name
        st = eng.stats()
        assert st.prefix_cache_hit_tokens > 0, name
        if name == "evicting":
            assert st.prefix_cache_evictions > 0
        assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


def test_fully_cached_scoring_runs_no_layer(tiny_models) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True)
    ids = rand_ids(24, 5)  # 6 full blocks of 4
    first = eng.generate([ids], scoring(0))[0]
    calls = 0
    forward = eng.model.forward

    def counting(*a, **k):
        nonlocal calls
        calls += 1
        return forward(*a, **k)

    eng.model.forward = counting
    again = eng.generate([ids], scoring(0, k=3), check=True)[0]
    assert calls == 0 and again.cached_tokens == 24
    assert again.input_token_logprobs == first.input_token_logprobs
    assert_rows(again.input_token_logprobs, ids, 0, hf_scores(path, ids, 0))
    store_off = make_engine(path, enable_prefix_cache=True, hidden_state_store=False)
    store_off.generate([ids], scoring(0))
    assert store_off.generate([ids], scoring(10))[0].cached_tokens == 8  # SGLang rule: blocks before N only


def test_generation_same_with_cache_hits(tiny_models) -> None:
    path = tiny_models["qwen2"]
    cold = make_engine(path)
    warm = make_engine(path, enable_prefix_cache=True)
    prompts = [rand_ids(20, 1), rand_ids(20, 1) + rand_ids(5, 2), rand_ids(16, 1)]
    expected = cold.generate(prompts, greedy(8))
    warm.generate(prompts, greedy(8))
    got = warm.generate(prompts, greedy(8), check=True)
    for e, g in zip(expected, got, strict=True):
        assert g.new_token_ids == e.new_token_ids
        assert [v for v, _ in g.output_token_logprobs] == pytest.approx([v for v, _ in e.output_token_logprobs],
                                                                        abs=ATOL)
    assert got[2].cached_tokens == 12  # 16 tokens, last one always computed: 3 blocks of 4


def test_mixed_batch_with_cache_and_preemption(tiny_models) -> None:
    path = tiny_models["llama"]
    items = _mc_items(n_ctx=2, ctx_len=18, end_len=5, seed=3)
    prompts = [ids for ids, _ in items] + [rand_ids(12, 7), rand_ids(9, 8)]
    params = [scoring(n) for _, n in items] + [greedy(10), greedy(7)]
    expected = make_engine(path).generate(prompts, params)
    eng = make_engine(path, enable_prefix_cache=True, num_kv_blocks=16, max_num_batched_tokens=12)
    for _ in range(2):
        got = eng.generate(prompts, params, check=True)
        for e, g in zip(expected, got, strict=True):
            assert g.new_token_ids == e.new_token_ids
            if e.input_token_logprobs is not None:
                assert [v for v, _ in g.input_token_logprobs] == pytest.approx(
                    [v for v, _ in e.input_token_logprobs], abs=ATOL)
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


def test_requests_in_the_same_step_share_a_new_prefix(tiny_models) -> None:
    """Four endings of one context submitted together: the first computes the context, the other three
    share its blocks in the same step (K/V are written before attention reads, per layer)."""
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True, max_num_batched_tokens=256)
    ctx = rand_ids(40, 9)
    prompts = [ctx + rand_ids(5, 20 + i) for i in range(4)]
    outs = eng.generate(prompts, [scoring(0)] * 4, check=True)
    assert [o.cached_tokens for o in outs] == [0, 40, 40, 40]
    for ids, out in zip(prompts, outs, strict=True):
        assert_rows(out.input_token_logprobs, ids, 0, hf_scores(path, ids, 0))
