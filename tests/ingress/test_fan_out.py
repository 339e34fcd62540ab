"""One HTTP request's worker requests admitted as one unit (ingress/fan_out.py): tagged with one group and the
tokens each shares with an earlier one, and refused with 400 naming the worker's queue bounds when an idle worker
could never queue them (unit tests; the served case is tests/e2e/test_one_client_served.py)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingress.app import build_fastapi_app
from ingress.errors import InvalidRequest
from ingress.fan_out import as_one_unit, common_prefix
from protocol import GenerateRequest, SamplingParams
from tests.helpers import openai_fakes
from tests.helpers.fakes import INFO, FakeBackend

SCORING = {"max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
BOUNDED = replace(INFO, max_queued_requests=64, max_queued_tokens=1000)


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_is_the_longest_common_prefix(a: list[int], b: list[int]) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == n


def req(rid: str, ids: list[int]) -> GenerateRequest:
    return GenerateRequest(rid, input_ids=ids, params=SamplingParams(max_tokens=0))


def test_score_like_requests_share_the_query_and_the_item() -> None:
    query, items, labels = list(range(1, 301)), [[400, 401], [500]], [7, 8, 9]
    requests = [req(f"{i}-{j}", [*query, *item, t]) for i, item in enumerate(items) for j, t in enumerate(labels)]
    tagged = as_one_unit(requests, BOUNDED)  # 6 x ~303 tokens: 1,815 one by one, 306 + 5 + 301 + 2 as one unit
    assert len({r.group for r in tagged}) == 1 and tagged[0].group is not None
    assert [r.shared_tokens for r in tagged] == [0, 302, 302, 300, 301, 301]
    assert [(r.rid, r.input_ids) for r in tagged] == [(r.rid, r.input_ids) for r in requests]


def test_a_lone_request_is_left_alone() -> None:
    (only,) = as_one_unit([req("a", list(range(5000)))], BOUNDED)  # over max_queued_tokens: an empty queue takes it
    assert only.group is None and only.shared_tokens == 0


def test_a_group_an_idle_worker_cannot_queue_is_a_400_naming_both_bounds() -> None:
    distinct = [req(f"r{i}", [i] * 300) for i in range(4)]  # 1,200 tokens, nothing shared
    with pytest.raises(InvalidRequest) as e:
        as_one_unit(distinct, BOUNDED)
    assert "4 worker requests of 1200 prompt tokens" in e.value.message
    assert "max_queued_tokens" in e.value.message and "max_queued_requests" in e.value.message
    with pytest.raises(InvalidRequest, match="max_queued_requests"):
        as_one_unit([req(f"r{i}", [i]) for i in range(3)], replace(BOUNDED, max_queued_requests=2))


@pytest.mark.asyncio
async def test_generate_batch_that_never_fits_is_refused_before_any_work() -> None:
    backend = FakeBackend()
    backend.info = BOUNDED
    app = build_fastapi_app(backend)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/generate", json={"input_ids": [[i % 90 + 1] * 300 for i in range(4)], **SCORING})
        assert r.status_code == 400 and "max_queued_tokens" in r.json()["message"], r.text
        ok = await c.post("/generate", json={"input_ids": [[5] * 300 + [i + 1] for i in range(4)], **SCORING})
        assert ok.status_code == 200, ok.text
    assert len(backend.requests) == 4  # only the batch that fits reached a worker
    assert len({r.group for r in backend.requests}) == 1
    assert [r.shared_tokens for r in backend.requests] == [0, 300, 300, 300]


def test_openai_fake_info_has_no_bounds() -> None:
    # The OpenAI fakes' model says nothing of queue bounds: nothing is refused for them (None: unknown).
    assert openai_fakes.INFO.max_queued_tokens is None
