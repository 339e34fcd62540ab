"""The engine's operator counters (engine/stats.py), counted exactly on a tiny model."""

from __future__ import annotations

from protocol.sampling import SamplingParams
from tests.helpers.engine import greedy, make_engine, scoring


def test_hidden_store_rows_counted_exactly(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"], enable_prefix_cache=True, hidden_state_store=True)
    ids = list(range(3, 3 + 24))  # 6 full blocks of 4
    eng.generate([ids], scoring(2))
    assert eng.stats().hidden_store_rows == 0  # cold: every row ran through the transformer
    eng.generate([ids], scoring(2))
    # Warm: the cached prefix is the whole prompt (a scoring request computes nothing), so rows 2 .. 22
    # (21 rows, each scoring the next token) all come from the store.
    assert eng.stats().hidden_store_rows == 21
    stats = eng.stats()
    assert stats.prefix_cache_hit_tokens == 24 and stats.prefix_cache_query_tokens == 48


def test_steps_and_tokens_per_step(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"], max_num_batched_tokens=8)
    eng.generate([list(range(3, 23))], greedy(3))  # 20 prompt tokens in chunks of 8, then 2 decodes
    steps = eng.counters.drain_steps()
    assert [s.num_tokens for s in steps] == [8, 8, 4, 1, 1]
    assert all(s.duration_s > 0 and s.num_seqs == 1 for s in steps)
    assert eng.stats().steps == 5
    assert eng.counters.drain_steps() == []  # drained once


def test_preemptions_counted(tiny_models) -> None:
    # 8 blocks of 4 tokens: two requests growing to 14 tokens each cannot both stay.
    eng = make_engine(tiny_models["llama"], num_kv_blocks=6, max_num_batched_tokens=64)
    outs = eng.generate([list(range(3, 13)), list(range(20, 30))], greedy(8), check=True)
    assert all(len(o.new_token_ids) == 8 for o in outs)
    assert eng.stats().preemptions >= 1


def test_token_load_of_queued_and_running(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"], max_num_batched_tokens=8, max_num_seqs=1)
    eng.add_request("a", list(range(3, 15)), SamplingParams(max_tokens=2, temperature=0.0))
    eng.add_request("b", list(range(3, 8)), SamplingParams(max_tokens=2, temperature=0.0))
    assert (eng.stats().queued_tokens, eng.stats().running_tokens) == (17, 0)
    eng.step()  # "a" runs (8 of its 12 tokens), "b" waits: max_num_seqs=1
    assert (eng.stats().queued_tokens, eng.stats().running_tokens) == (5, 12)

