"""Slow clients at the ingress (ASGI-level, over the fake backend): a body that does not arrive within
`body_timeout_s` is answered 408 with the connection closed, and a method that takes no body is answered without
reading one (a body declared on it: 400). The real-server test with hundreds of slow connections is
tests/e2e/test_one_client_served.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.settings import IngressSettings
from tests.helpers.fakes import SCORE, FakeBackend


async def call(app, method: str, path: str, headers: list[tuple[bytes, bytes]], chunks: list[tuple[float, bytes]]):
    """Drive the app as a server would: `chunks` are (delay before it, bytes) of the body. Returns (status,
    headers, body) and how many body messages the app asked for."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    pending = list(chunks)
    asked = 0
    out: list[dict] = []

    async def receive() -> dict:
        nonlocal asked
        asked += 1
        if not pending:
            await asyncio.sleep(3600)  # a client that never sends more (nor leaves)
        delay, data = pending.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": data, "more_body": bool(pending)}

    async def send(message: dict) -> None:
        out.append(message)

    await asyncio.wait_for(app(scope, receive, send), 10)
    start = next(m for m in out if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in out if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), json.loads(body), asked


def STALLS_AFTER(first: bytes) -> list[tuple[float, bytes]]:  # noqa: N802  # reads as a constant at call sites
    """A body whose first bytes come at once and whose rest never does."""
    return [(0.0, first), (3600.0, b"")]


JSON = [(b"content-type", b"application/json")]


def app(**settings):
    return build_fastapi_app(FakeBackend(), IngressSettings(**settings))


@pytest.mark.asyncio
async def test_a_body_that_trickles_past_the_deadline_is_408_and_closes() -> None:
    body = json.dumps(SCORE).encode()
    trickle = [(0.1, body[i:i + 4]) for i in range(0, len(body), 4)]  # 0.1 s per 4 bytes: seconds in all
    status, headers, answer, _ = await call(app(body_timeout_s=0.3), "POST", "/generate",
                                            [(b"content-type", b"application/json")], trickle)
    assert status == 408 and headers[b"connection"] == b"close"
    assert answer["object"] == "error" and answer["code"] == 408
    assert "body_timeout_s" in answer["message"] and "0.3 s" in answer["message"]
    # The OpenAI routes answer in their own shape.
    status, _, answer, _ = await call(app(body_timeout_s=0.2), "POST", "/v1/completions", [], STALLS_AFTER(b'{"pro'))
    assert status == 408 and answer["error"]["type"] == "timeout_error"
    assert "body_timeout_s" in answer["error"]["message"]


@pytest.mark.asyncio
async def test_a_body_in_time_is_served_even_when_it_comes_in_pieces() -> None:
    body = json.dumps(SCORE).encode()
    status, _, answer, _ = await call(app(body_timeout_s=5), "POST", "/generate", JSON,
                                      [(0.05, body[:10]), (0.05, body[10:])])
    assert status == 200 and "meta_info" in answer


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/health", "/v1/models"])
async def test_routes_that_take_no_body_never_read_one(path: str) -> None:
    # No body declared: served (the server's first message is the empty body, as uvicorn's is).
    status, _, _, _ = await call(app(), "GET", path, [], [(0.0, b"")])
    assert status == 200
    for header in [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")]:
        status, _, answer, asked = await call(app(body_timeout_s=60), "GET", path, [header], [(30.0, b"hello")])
        assert status == 400 and asked == 0, answer
        assert f"GET {path} takes no request body." in json.dumps(answer)


@pytest.mark.asyncio
async def test_health_with_a_body_is_refused_even_when_keys_are_set() -> None:
    status, _, _, asked = await call(app(api_keys=("k",)), "GET", "/health", [(b"content-length", b"100")],
                                     [(30.0, b"x" * 100)])
    assert status == 400 and asked == 0


def test_body_timeout_must_be_positive_and_finite() -> None:
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="body_timeout_s"):
            IngressSettings(body_timeout_s=bad)


@pytest.mark.asyncio
async def test_other_requests_are_answered_while_slow_bodies_wait() -> None:
    application = app(body_timeout_s=2)
    body = json.dumps(SCORE).encode()
    slow = [asyncio.create_task(call(application, "POST", "/generate", [], STALLS_AFTER(body[:5]))) for _ in range(200)]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
        for _ in range(5):
            assert (await c.post("/generate", json=SCORE)).status_code == 200
    assert not any(t.done() for t in slow)  # they still wait: the others were not queued behind them
    assert {(await t)[0] for t in slow} == {408}
