"""request_timeout_s: a request past its deadline is aborted (its worker stream closed) and answered 504 before
any byte, or with a final error event after. Unit tests over the fake backend; the real-Ray test checks the
worker's KV blocks are free afterwards."""

from __future__ import annotations

import time

import httpx
import pytest
from ray import serve

from ingress.app import build_fastapi_app
from ingress.settings import IngressSettings
from tests.fakes import HANG, SCORE, FakeBackend, fake_model
from tests.serve_helpers import app_args, deploy, sse_events, worker_stats
from workers.protocol import GenerateRequest


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


def test_deadline_on_real_workers_frees_the_kv_cache(serve_url: str) -> None:
    """A long generation over a 2 s deadline: 504 for the whole answer, an error event for the stream; then
    the worker holds no KV block."""
    app, url = "deadline", serve_url + "/deadline"
    deploy(app, "/deadline", app_args(num_workers=1, request_timeout_s=2.0))
    try:
        body = {"prompt": "Count to a thousand:", "max_tokens": 2000, "ignore_eos": True}
        t0 = time.monotonic()
        r = httpx.post(url + "/generate", json=body, timeout=60)
        assert r.status_code == 504, r.text
        assert "request_timeout_s" in r.json()["message"]
        assert time.monotonic() - t0 < 20
        s = httpx.post(url + "/v1/completions", json={"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True,
                                                      "stream": True}, timeout=60)
        events = sse_events(s)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 504, events[-3:]
        assert len(events) > 2  # tokens came before the deadline
        deadline = time.monotonic() + 20
        while True:
            (stats,) = worker_stats(app, samples=2).values()
            if stats.kv_blocks_used == 0 and stats.running == 0:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.2)
    finally:
        serve.delete(app)
