"""request_timeout_s: a request past its deadline is aborted (its worker stream closed) and answered 504 before
any byte, or with a final error event after. Unit tests over the fake backend; the real-Ray test
(tests/e2e/test_deadlines_served.py) checks the worker's KV blocks are free afterwards."""

from __future__ import annotations

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.settings import IngressSettings
from protocol import GenerateRequest
from tests.helpers.fakes import HANG, SCORE, FakeBackend, fake_model
from tests.helpers.serve import sse_events


def client(backend: FakeBackend, timeout_s: float) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, IngressSettings(request_timeout_s=timeout_s))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def hangs(req: GenerateRequest):
    yield HANG


def first_then_hangs(req: GenerateRequest):
    yield next(iter(fake_model(req)))
    yield HANG


@pytest.mark.asyncio
async def test_a_request_past_its_deadline_is_504_and_aborted() -> None:
    backend = FakeBackend(hangs)
    async with client(backend, 0.2) as c:
        r = await c.post("/generate", json=SCORE)
        assert r.status_code == 504, r.text
        assert "request_timeout_s" in r.json()["message"] and "0.2 s" in r.json()["message"]
        o = await c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
        assert o.status_code == 504 and o.json()["error"]["type"] == "timeout_error"
    assert len(backend.aborted) == 2


@pytest.mark.asyncio
async def test_a_stream_past_its_deadline_ends_with_an_error_event() -> None:
    backend = FakeBackend(first_then_hangs)
    async with client(backend, 0.3) as c:
        r = await c.post("/generate", json={"input_ids": [1, 2], "max_tokens": 5, "stream": True})
        assert r.status_code == 200
        events = sse_events(r)
        assert events[-1] == "[DONE]" and events[0]["meta_info"]["finish_reason"] is None
        finish = events[-2]["meta_info"]["finish_reason"]
        assert finish["type"] == "error" and "request_timeout_s" in finish["message"]
        o = await c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 5, "stream": True})
        error = sse_events(o)[-2]["error"]
        assert error["code"] == 504 and "request_timeout_s" in error["message"]
    assert len(backend.aborted) == 2


@pytest.mark.asyncio
async def test_no_deadline_when_none() -> None:
    async with client(FakeBackend(), None) as c:  # type: ignore[arg-type]
        assert (await c.post("/generate", json=SCORE)).status_code == 200
