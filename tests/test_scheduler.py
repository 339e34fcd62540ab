"""The scheduler's bookkeeping: token and request budgets, preemption, one behaviour per test."""

from __future__ import annotations

from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence


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
