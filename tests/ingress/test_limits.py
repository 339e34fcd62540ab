"""The ingress's limits (unit tests over the fake backend): top-k, logprob entries and body bytes are refused
before any worker request is sent, in each route's error shape, with a message naming the config field."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.limits import logprob_entries
from ingress.settings import IngressSettings
from protocol import GenerateRequest, SamplingParams
from tests.helpers.fakes import FakeBackend
from tests.helpers.openai_fakes import Backend as OpenAIBackend


def client(backend: FakeBackend, **settings) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, IngressSettings(**settings))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def contract_error(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["object"] == "error" and body["code"] == status and body["param"] is None
    assert words in body["message"], body


def openai_error(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"}
    assert r.json()["error"]["code"] == status and words in r.json()["error"]["message"], r.text


def score(n_ids: int, k: int | None = None, start: int = 0) -> dict:
    body = {"input_ids": [i % 90 + 1 for i in range(n_ids)], "max_tokens": 0, "return_logprob": True,
            "logprob_start_len": start}
    if k is not None:
        body["top_logprobs_num"] = k
    return body


def test_entries_count_scored_rows_and_generated_tokens() -> None:
    scoring = GenerateRequest("a", input_ids=list(range(10)), params=SamplingParams(
        max_tokens=0, return_logprob=True, logprob_start_len=3, top_logprobs_num=4))
    assert logprob_entries(scoring) == (10 - 3 - 1) * 5
    both = GenerateRequest("b", input_ids=list(range(10)), params=SamplingParams(
        max_tokens=7, return_logprob=True, logprob_start_len=0, top_logprobs_num=2))
    assert logprob_entries(both) == (9 + 7) * 3
    no_logprobs = GenerateRequest("c", input_ids=[1, 2], params=SamplingParams(max_tokens=50, top_logprobs_num=0))
    assert logprob_entries(no_logprobs) == 0


async def test_generate_top_k_over_the_limit_is_refused_before_any_work() -> None:
    backend = FakeBackend()
    async with client(backend, max_top_logprobs=5) as c:
        assert (await c.post("/generate", json=score(4, k=5))).status_code == 200
        r = await c.post("/generate", json=score(4, k=6))
    contract_error(r, 400, "max_top_logprobs")
    assert "6" in r.json()["message"] and "5" in r.json()["message"]
    assert len(backend.requests) == 1  # only the request within the limit reached a worker


async def test_the_workers_reported_logprob_limits_are_the_ones_checked() -> None:
    """The logprob limits are the workers' runtime settings (their user_config): the ingress checks what they
    report in ModelInfo, raised or lowered, over its own start-up value."""
    backend = FakeBackend()
    backend.info = dataclasses.replace(backend.info, max_top_logprobs=8, max_logprob_entries=30)
    async with client(backend, max_top_logprobs=5) as c:
        assert (await c.post("/generate", json=score(4, k=7))).status_code == 200  # over 5: the workers say 8
        contract_error(await c.post("/generate", json=score(4, k=9)), 400, "max_top_logprobs")
        contract_error(await c.post("/generate", json=score(12, k=2)), 400, "max_logprob_entries")  # 33 > 30
    assert len(backend.requests) == 1


async def test_generate_entries_over_the_limit_are_refused_at_the_boundary() -> None:
    backend = FakeBackend()
    # 11 ids scored from 0: 10 rows x (1 + 2) = 30 entries.
    async with client(backend, max_logprob_entries=30) as c:
        assert (await c.post("/generate", json=score(11, k=2))).status_code == 200
        r = await c.post("/generate", json=score(12, k=2))  # 33
        contract_error(r, 400, "max_logprob_entries")
        assert "33" in r.json()["message"]
        # A generation's tokens are rows too.
        gen = {"input_ids": [1, 2], "max_tokens": 31, "return_logprob": True}
        contract_error(await c.post("/generate", json=gen), 400, "max_logprob_entries")
        assert (await c.post("/generate", json={**gen, "max_tokens": 30})).status_code == 200
    assert len(backend.requests) == 2


async def test_openai_limits_use_openai_error_body_and_sum_over_prompts() -> None:
    backend = OpenAIBackend()
    async with client(backend, max_top_logprobs=3, max_logprob_entries=40) as c:
        r = await c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1, "logprobs": 4})
        openai_error(r, 400, "max_top_logprobs")
        one = {"prompt": [[1, 2, 3, 4, 5]], "echo": True, "max_tokens": 5, "logprobs": 3}  # (4 + 5) x 4 = 36
        assert (await c.post("/v1/completions", json=one)).status_code == 200
        two = {**one, "prompt": [[1, 2, 3, 4, 5], [6, 7]]}  # 36 + (1 + 5) x 4 = 60
        r = await c.post("/v1/completions", json=two)
        openai_error(r, 400, "max_logprob_entries")
        assert "60" in r.json()["error"]["message"]
    assert len(backend.requests) == 1


@pytest.mark.parametrize("path, check", [("/generate", contract_error), ("/v1/completions", openai_error),
                                         ("/tokenize", openai_error)])
async def test_a_body_over_max_request_bytes_is_413_on_its_content_length(path, check) -> None:
    backend = OpenAIBackend()
    async with client(backend, max_request_bytes=100) as c:
        r = await c.post(path, content=b"x" * 101, headers={"content-type": "application/json"})
    check(r, 413, "max_request_bytes")
    assert "101" in r.text and "100" in r.text
    assert backend.requests == []


async def test_a_chunked_body_is_counted_as_it_arrives() -> None:
    """No Content-Length: the bytes read are counted, and the limit applies before any parsing."""
    backend = FakeBackend()

    async def chunks():
        for _ in range(50):
            yield b" " * 10

    async with client(backend, max_request_bytes=100) as c:
        r = await c.post("/generate", content=chunks(), headers={"content-type": "application/json"})
        contract_error(r, 413, "max_request_bytes")

        async def small():
            yield b'{"input_ids": [1, 2, 3], "max_tokens": 2}'

        ok = await c.post("/generate", content=small(), headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text


async def test_a_body_at_the_limit_is_served() -> None:
    backend = FakeBackend()
    body = b'{"input_ids": [1, 2, 3], "max_tokens": 2}'
    async with client(backend, max_request_bytes=len(body)) as c:
        r = await c.post("/generate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_a_generate_batch_sums_its_items_entries() -> None:
    backend = FakeBackend()
    item = {"max_tokens": 0, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
    async with client(backend, max_logprob_entries=20) as c:  # each item: 5 rows x 2 = 10 entries
        ok = await c.post("/generate", json={**item, "input_ids": [[1, 2, 3, 4, 5, 6]] * 2})
        assert ok.status_code == 200, ok.text
        r = await c.post("/generate", json={**item, "input_ids": [[1, 2, 3, 4, 5, 6]] * 3})
    contract_error(r, 400, "max_logprob_entries")
    assert "30" in r.json()["message"]
    assert len(backend.requests) == 2
