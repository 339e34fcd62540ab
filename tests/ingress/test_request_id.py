"""Request ids and the access log of the ingress app, over the fake backend (no Ray): the id is taken from
X-Request-ID or made, returned on every answer, sent to the worker, and logged once per request."""

from __future__ import annotations

import logging

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.edge.request_record import RequestRecord
from tests.helpers.fakes import SCORE, FakeBackend

COMPLETION = {"model": "tiny", "prompt": [3, 4, 5], "max_tokens": 2, "temperature": 0}


def app_client(backend: FakeBackend, records: list[RequestRecord]) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, on_request=records.append)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("rayscore access")]


async def test_client_id_is_echoed_sent_to_worker_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    backend, records = FakeBackend(), []
    caplog.set_level(logging.INFO, logger="ray.serve")
    async with app_client(backend, records) as c:
        r = await c.post("/generate", json={"input_ids": "x"}, headers={"X-Request-ID": "trace-42"})
    assert r.status_code == 422  # a bad body is still answered with the id
    assert r.headers["x-request-id"] == "trace-42"
    async with app_client(backend, records) as c:
        r = await c.post("/generate", json={**SCORE, "session_id": "secret"}, headers={"X-Request-ID": "trace-43",
                                                           "Authorization": "Bearer sk-hidden"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-43"
    assert backend.requests[-1].rid == "trace-43" and r.json()["meta_info"]["id"] == "trace-43"
    (line,) = [x for x in access_lines(caplog) if "id=trace-43" in x]
    assert "route=/generate" in line and "status=200" in line and "kind=scoring" in line
    assert "tokens_in=4" in line and "tokens_out=0" in line and "latency_ms=" in line
    # Never the body or a key.
    logged = "\n".join(access_lines(caplog))
    assert "sk-hidden" not in logged and "secret" not in logged and "input_ids" not in logged
    assert [rec.status for rec in records] == [422, 200]


async def test_id_made_when_absent_or_unusable_and_body_rid_wins() -> None:
    backend, records = FakeBackend(), []
    async with app_client(backend, records) as c:
        made = await c.get("/health")
        odd = await c.post("/generate", json=SCORE, headers={"X-Request-ID": "bad id\twith spaces"})
        named = await c.post("/generate", json={**SCORE, "rid": "body-rid"}, headers={"X-Request-ID": "hdr"})
    assert len(made.headers["x-request-id"]) == 32
    assert odd.headers["x-request-id"] != "bad id\twith spaces"
    assert backend.requests[0].rid == odd.headers["x-request-id"]
    assert named.headers["x-request-id"] == "hdr" and backend.requests[1].rid == "body-rid"
    assert len({r.request_id for r in records}) == 3


async def test_streamed_and_completion_requests_record_tokens() -> None:
    backend, records = FakeBackend(), []
    async with app_client(backend, records) as c:
        s = await c.post("/generate", json={"input_ids": [3, 4, 5], "max_tokens": 3, "stream": True},
                         headers={"X-Request-ID": "s-1"})
        o = await c.post("/v1/completions", json=COMPLETION, headers={"X-Request-ID": "o-1"})
    assert s.status_code == 200 and o.status_code == 200
    assert o.json()["id"] == "cmpl-o-1" and backend.requests[-1].rid.startswith("cmpl-o-1")
    gen, comp = records
    assert (gen.route, gen.kind, gen.prompt_tokens, gen.completion_tokens, gen.finish_reason) == \
        ("/generate", "generation", 3, 3, "length")
    assert (comp.route, comp.prompt_tokens, comp.completion_tokens) == ("/v1/completions", 3, 2)
    assert gen.first_byte_s is not None and gen.latency_s is not None and gen.first_byte_s <= gen.latency_s


async def test_errors_are_logged_with_the_id(caplog: pytest.LogCaptureFixture) -> None:
    backend, records = FakeBackend(), []
    backend.info = RuntimeError("no worker")
    caplog.set_level(logging.INFO, logger="ray.serve")
    async with app_client(backend, records) as c:
        r = await c.post("/generate", json=SCORE, headers={"X-Request-ID": "down-1"})
    assert r.status_code == 503 and r.headers["x-request-id"] == "down-1"
    (rec,) = [x for x in caplog.records if "id=down-1" in x.getMessage()]
    assert rec.levelno == logging.WARNING and "status=503" in rec.getMessage()
    assert records[0].status == 503 and records[0].route == "/generate"
