"""The scheduler's bookkeeping: token and request budgets, preemption, the long-prefill cap, one behaviour per
test."""

from __future__ import annotations

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import SamplingParams
from tests.helpers.engine import assert_rows, make_engine, rand_ids, scoring
from tests.helpers.reference import hf_scores


def _seq(rid: str, n: int, max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(range(2, 2 + n)), SamplingParams(max_tokens=max_tokens))


def test_scheduler_chunks_within_token_budget() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=10, max_num_seqs=8)
    a, b = _seq("a", 7), _seq("b", 9)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in out.chunks] == [("a", 0, 7), ("b", 0, 3)]
    assert out.num_tokens == 10
    kv.check_integrity(sched.live())


def test_scheduler_respects_max_num_seqs() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=2)
    for i in range(3):
        sched.add(_seq(str(i), 3))
    out = sched.schedule()
    assert len(out.chunks) == 2 and len(sched.waiting) == 1


def test_scheduler_preempts_newest_when_out_of_blocks() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_cache=False)  # 16 tokens
    sched = Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8)
    a, b = _seq("a", 8), _seq("b", 8)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    for s in (a, b):  # both prefilled and each generated a token: each now needs a third block
        s.num_computed_tokens = 8
        s.token_ids.append(5)
    out = sched.schedule()
    assert out.preempted == [b]
    assert sched.num_preemptions == 1
    assert b.num_computed_tokens == 0 and b.block_table == [] and sched.waiting[0] is b
    assert [c.seq for c in out.chunks] == [a]
    kv.check_integrity(sched.live())


def test_a_request_in_flight_is_neither_scheduled_nor_preempted() -> None:
    """Pipeline overlap's rules: a step takes at most its share (max_chunks) and skips requests whose step is in
    flight; out of blocks, the newest request not in flight is preempted, the scheduling one itself at the latest."""
    kv = KVCacheManager(num_blocks=5, block_size=4, enable_prefix_cache=False)  # 20 tokens
    sched = Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8)
    a, b, c = _seq("a", 4), _seq("b", 4), _seq("c", 8)
    for s in (a, b, c):
        sched.add(s)
    first = sched.schedule(max_chunks=2)
    assert [ch.seq for ch in first.chunks] == [a, b] and list(sched.waiting) == [c]
    a.in_flight = b.in_flight = True
    second = sched.schedule(max_chunks=2)
    assert [ch.seq for ch in second.chunks] == [c]  # a and b are in the step in flight
    for s in (a, b, c):  # every step back: each prefilled and generated a token, each needs one more block
        s.in_flight = False
        s.num_computed_tokens = s.num_tokens
        s.token_ids.append(5)
    c.in_flight = True  # c's next step is in flight: the newest running request, yet never a victim
    out = sched.schedule()
    assert out.preempted == [b] and [ch.seq for ch in out.chunks] == [a]
    assert c.block_table and c.num_computed_tokens == 8 and sched.waiting[0] is b
    kv.check_integrity(sched.live())


def _scoring_seq(rid: str, n: int) -> Sequence:
    return Sequence(rid, list(range(2, 2 + n)), SamplingParams(max_tokens=0, return_logprob=True))


def _run_step(sched: Scheduler) -> list[tuple[str, int, int]]:
    """Schedule one step and record it as computed (no model: the scheduler's bookkeeping only)."""
    out = sched.schedule()
    for chunk in out.chunks:
        sched.update(chunk, 0, None)
        if chunk.seq.num_computed_tokens == chunk.seq.num_tokens:  # scoring: done with its prefill
            sched.finish(chunk.seq)
    return [(c.seq.request_id, c.start, c.num_tokens) for c in out.chunks]


def test_long_prefill_alone_takes_the_whole_budget() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=32, max_num_seqs=8, long_prefill_token_threshold=8)
    sched.add(_scoring_seq("long", 100))
    assert [_run_step(sched) for _ in range(4)] == [[("long", s, 32)] for s in (0, 32, 64)] + [[("long", 96, 4)]]
    assert not sched.has_unfinished()


def test_short_request_during_long_prefill_is_scheduled_next_step_and_finishes_first() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=32, max_num_seqs=8, long_prefill_token_threshold=8)
    long, short = _scoring_seq("long", 100), _scoring_seq("short", 20)
    sched.add(long)
    assert _run_step(sched) == [("long", 0, 32)]
    sched.add(short)  # arrives mid-prefill
    # The long prefill's first share is capped at 8; the short one takes its 20; the 4 left go back to the long.
    assert _run_step(sched) == [("long", 32, 12), ("short", 0, 20)]
    assert short.is_finished and not long.is_finished
    assert _run_step(sched) == [("long", 44, 32)]  # alone again: the whole budget
    kv.check_integrity(sched.live())


def test_several_long_prefills_fill_the_budget_oldest_first() -> None:
    """Capped shares first, then the rest oldest first: no budget is left unused."""
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=32, max_num_seqs=8, long_prefill_token_threshold=8)
    for rid in ("a", "b", "c"):
        sched.add(_scoring_seq(rid, 60))
    assert _run_step(sched) == [("a", 0, 16), ("b", 0, 8), ("c", 0, 8)]


def test_capped_chunk_extension_registers_its_blocks_in_the_prefix_cache() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_cache=True)
    sched = Scheduler(kv, max_num_batched_tokens=32, max_num_seqs=8, long_prefill_token_threshold=8)
    long = _scoring_seq("long", 100)
    sched.add(long)
    sched.schedule()
    assert len(long.block_hashes) == 8  # all 32 scheduled tokens' full blocks, not only the first 8 tokens'
    kv.check_integrity(sched.live())


def test_default_threshold_is_a_quarter_of_the_budget() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_cache=False)
    assert Scheduler(kv, max_num_batched_tokens=2048, max_num_seqs=8).chunk_cap == 512


def test_engine_answers_short_request_during_long_prefill_first_and_both_exact(tiny_models) -> None:
    """On a real model: a short request that arrives while a long prompt is mid-prefill is answered steps
    before it, and the chunk boundaries the cap moves change no logprob."""
    path = tiny_models["llama"]
    eng = make_engine(path, max_num_batched_tokens=32, long_prefill_token_threshold=8)
    long_ids, short_ids = rand_ids(200, seed=1), rand_ids(20, seed=2)
    eng.add_request("long", long_ids, scoring(0))
    outs: dict[str, list[RequestOutput]] = {"long": [], "short": []}
    finished_at: dict[str, int] = {}
    step = 0
    while eng.has_unfinished():
        step += 1
        if step == 2:
            eng.add_request("short", short_ids, scoring(3))
        for out in eng.step():
            outs[out.request_id].append(out)
            if out.finished:
                finished_at[out.request_id] = step
        eng.check_integrity()
    assert finished_at == {"short": 2, "long": 7}
    for rid, ids, start in (("long", long_ids, 0), ("short", short_ids, 3)):
        assert_rows(merge_outputs(outs[rid]).input_token_logprobs, ids, start, hf_scores(path, ids, start))
