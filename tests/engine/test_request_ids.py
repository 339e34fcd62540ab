"""A request id in use is refused (400) without touching the admission count of the request that holds it, and the
admission queue never loses or double-counts tokens, whatever the order of events."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.async_engine import AsyncEngine
from engine.core.admission import OVERLOADED, AdmissionQueue
from ingress.errors import InvalidRequest
from ingress.generate.schemas import GenerateBody
from ingress.generate.validation import split_batch
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring


@pytest.fixture(scope="module")
def aengine(tiny_models):
    eng = AsyncEngine(engine=make_engine(tiny_models["llama"], max_num_batched_tokens=8, max_queued_tokens=1000))
    yield eng
    eng.shutdown()


async def test_reused_id_is_refused_400_and_leaks_nothing(aengine: AsyncEngine) -> None:
    """The first request runs to its end with its own answer; the second, same id, is told why (400); afterwards
    nothing is counted as queued. Before the fix each such call leaked the first request's tokens for good."""
    for _ in range(3):
        first = aengine.generate("dup", rand_ids(300, 1), greedy(20, logprobs=False))
        out = await first.__anext__()  # running now, its id held
        again = [o async for o in aengine.generate("dup", rand_ids(300, 2), scoring(0))]
        assert len(again) == 1 and again[0].finish_reason.code == 400
        assert again[0].finish_reason.message == "request id 'dup' is already in use"
        outs = [out] + [o async for o in first]
        assert outs[-1].finished and outs[-1].finish_reason.type != "error"
        assert sum(len(o.new_token_ids) for o in outs) == 20
    assert aengine.stats().queued_tokens == 0 and aengine.stats().queued == 0


async def test_many_reuses_do_not_fill_the_queue(aengine: AsyncEngine) -> None:
    """The issue's attack: many reuses of one id while it runs; a fresh request is still admitted after."""
    held = aengine.generate("held", rand_ids(200, 3), greedy(30, logprobs=False))
    await held.__anext__()
    refused = await asyncio.gather(*[_all(aengine, "held", rand_ids(400, i)) for i in range(12)])
    assert all(r[-1].finish_reason.code == 400 for r in refused)
    async for _ in held:
        pass
    ok = [o async for o in aengine.generate("fresh", rand_ids(400, 99), scoring(0))] + await _all(
        aengine, "fresh-2", rand_ids(400, 98))
    assert ok[-1].finish_reason.code != OVERLOADED and len(ok[-1].input_token_logprobs) == 399
    assert aengine.stats().queued_tokens == 0


async def _all(eng: AsyncEngine, rid: str, ids: list[int]) -> list:
    return [o async for o in eng.generate(rid, ids, scoring(0))]


def test_a_batch_that_repeats_an_id_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="must not repeat an id"):
        split_batch(GenerateBody(input_ids=[[1, 2], [3, 4]], rid=["x", "x"]))
    assert [b.rid for b in split_batch(GenerateBody(input_ids=[[1, 2], [3, 4]], rid=["x", "y"]))] == ["x", "y"]


# --- the admission queue: a property over random sequences of events ---------------------------------------
EVENTS = st.lists(st.tuples(st.sampled_from(["admit", "release", "start"]), st.integers(0, 7),
                            st.integers(1, 900)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_admission_counts_each_request_once_whatever_the_order(events: list[tuple[str, int, int]]) -> None:
    """Admit (as AsyncEngine does: never an id that waits), refuse, start, finish or abort in any order: the
    queued tokens are always the sum of the waiting requests' own, never negative, bounds respected, and zero
    once all are released."""
    q = AdmissionQueue(max_requests=4, max_tokens=2000)
    waiting: dict[str, int] = {}
    for kind, i, n in events:
        rid = f"r{i}"
        if kind == "admit":
            if rid in waiting:
                with pytest.raises(ValueError):
                    q.admit(rid, n)
                continue
            refusal = q.admit(rid, n)
            if refusal is None:
                waiting[rid] = n
            else:
                assert "max_queued" in refusal
        elif kind == "release":
            q.release(rid)
            waiting.pop(rid, None)
        else:
            q.release_started(lambda r, rid=rid: r == rid)
            waiting.pop(rid, None)
        assert q.queued == (len(waiting), sum(waiting.values()))
        assert len(waiting) <= 4 and (len(waiting) <= 1 or sum(waiting.values()) <= 2000)
    for rid in list(waiting):
        q.release(rid)
    assert q.queued == (0, 0)


GROUP_EVENTS = st.lists(st.tuples(st.sampled_from(["admit", "release", "start"]), st.integers(0, 7),
                                  st.integers(1, 900), st.sampled_from([None, "g", "h"]), st.integers(0, 1000)),
                        max_size=200)


@settings(max_examples=300, deadline=None)
@given(GROUP_EVENTS)
def test_admission_with_groups_counts_shared_tokens_once(events: list[tuple[str, int, int, str | None, int]]) -> None:
    """The same property with admission groups (one HTTP request's worker requests): a member is counted without
    its shared tokens exactly while another member of its group waits, a queue of only its own group takes it
    whatever its tokens, the count is always the sum of the waiting requests' own and returns to zero."""
    q = AdmissionQueue(max_requests=5, max_tokens=2000)
    waiting: dict[str, tuple[int, str | None]] = {}
    for kind, i, n, group, shared in events:
        rid = f"r{i}"
        if kind == "admit":
            if rid in waiting:
                continue
            in_group = group is not None and any(g == group for _, g in waiting.values())
            charge = n - min(shared, n) if in_group else n
            others = [c for c, g in waiting.values() if group is None or g != group]
            fits = len(waiting) < 5 and (not others or sum(c for c, _ in waiting.values()) + charge <= 2000)
            refusal = q.admit(rid, n, group, shared)
            assert (refusal is None) == fits, (refusal, waiting, rid, n, group, shared)
            if refusal is None:
                waiting[rid] = (charge, group)
        elif kind == "release":
            q.release(rid)
            waiting.pop(rid, None)
        else:
            q.release_started(lambda r, rid=rid: r == rid)
            waiting.pop(rid, None)
        assert q.queued == (len(waiting), sum(c for c, _ in waiting.values()))
    for rid in list(waiting):
        q.release(rid)
    assert q.queued == (0, 0)
