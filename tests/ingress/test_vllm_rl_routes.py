"""vLLM's RL routes at the ingress (the fake backend records the typed operations): each mode of /pause is its
engine pause, clear_cache flushes after abort and wait, /abort_requests with no ids aborts every request and with ids
names each (with and without /inference/v1/generate's prefix), /is_paused reads the workers' pause, refusals name
their field, and an API key alone does not open them (admin routes). The engine's side: tests/engine/test_pause.py;
on the served app: tests/e2e/test_vllm_rl_served.py."""

from __future__ import annotations

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.settings import IngressSettings
from protocol.control import Abort, FlushCache, Pause, Resume
from tests.helpers.fakes import FakeBackend


def client(backend: FakeBackend, settings: IngressSettings | None = None) -> httpx.AsyncClient:
    # No key configured: the admin routes are closed by default, so these tests open them as a trusted network would.
    app = build_fastapi_app(backend, settings or IngressSettings(open_admin_routes=True))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.parametrize(("query", "op"), [
    ("", Pause("abort")), ("?mode=abort", Pause("abort")), ("?mode=wait", Pause("in_place", drain=True)),
    ("?mode=keep", Pause("in_place")), ("?mode=keep&clear_cache=false", Pause("in_place")),
])
async def test_pause_modes_are_typed_operations(query: str, op: Pause) -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        assert (await c.get("/is_paused")).json() == {"is_paused": False}
        resp = await c.post("/pause" + query)
        assert resp.status_code == 200 and resp.json() == {"status": "paused"}
        assert backend.controls == [op]
        assert (await c.get("/is_paused")).json() == {"is_paused": True}
        assert (await c.post("/resume")).json() == {"status": "resumed"}
        assert backend.controls[-1] == Resume() and (await c.get("/is_paused")).json() == {"is_paused": False}


async def test_clear_cache_flushes_after_abort_or_wait() -> None:
    backend = FakeBackend()
    flushed: list[object] = []
    real = backend.control

    async def control(op):  # noqa: ANN001, ANN202
        flushed.append(op)
        return await real(op)

    backend.control = control  # type: ignore[method-assign]
    async with client(backend) as c:
        await c.post("/pause?mode=wait")
        await c.post("/pause?mode=abort&clear_cache=false")
        await c.post("/pause?mode=keep")
    assert flushed == [Pause("in_place", drain=True), FlushCache(), Pause("abort"), Pause("in_place")]


async def test_abort_requests() -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        for body in ({}, {"request_ids": []}):
            resp = await c.post("/abort_requests", json=body)
            assert resp.status_code == 200 and resp.json()["status"] == "aborted"
        assert backend.controls == [Abort(None), Abort(None)]
        backend.controls.clear()
        await c.post("/abort_requests", json={"request_ids": ["a", "generate-tokens-b"]})
        assert backend.controls == [Abort("a"), Abort("generate-tokens-a"), Abort("generate-tokens-b")]


@pytest.mark.parametrize(("method", "path", "kwargs", "message"), [
    ("post", "/pause?mode=drain", {}, "not one of vLLM's pause modes: abort, wait, keep"),
    ("post", "/pause?clear_cache=maybe", {}, "must be true or false"),
    ("post", "/abort_requests", {"content": b"[1]"}, "Request body must be a JSON object"),
    ("post", "/abort_requests", {"content": b"{"}, "Invalid JSON format"),
    ("post", "/abort_requests", {"json": {"request_ids": [1]}}, "list of request id strings"),
])
async def test_refusals(method: str, path: str, kwargs: dict, message: str) -> None:
    async with client(FakeBackend()) as c:
        resp = await getattr(c, method)(path, **kwargs)
    assert resp.status_code == 400 and message in resp.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/pause", "/resume", "/abort_requests", "/is_paused"])
async def test_admin_key_required(path: str) -> None:
    settings = IngressSettings(api_keys=("user",), admin_api_keys=("admin",))
    backend = FakeBackend()
    method = "get" if path == "/is_paused" else "post"
    async with client(backend, settings) as c:
        for key, status in (("user", 401), ("admin", 200)):
            resp = await getattr(c, method)(path, headers={"Authorization": f"Bearer {key}"},
                                            **({} if method == "get" else {"json": {}}))
            assert resp.status_code == status, resp.text
