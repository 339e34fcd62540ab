"""SGLang's weight routes at the ingress (over the fake backend): shapes of the answers, 400 on failure, and the
admin key: when keys are set only an admin key opens the POST routes, never a plain API key."""

from __future__ import annotations

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.edge.auth import with_keys
from ingress.settings import IngressSettings
from protocol import WeightUpdate
from protocol.control import FlushCache
from tests.helpers.fakes import SCORE, FakeBackend, FakeHandle

PLAIN, ADMIN = "plain-key", "admin-key"


def client(backend: FakeBackend, settings: IngressSettings | None = None) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, settings or IngressSettings(open_admin_routes=True))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_update_answers_in_sglangs_shape(tmp_path) -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        r = await c.post("/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "v2",
                                                            "abort_all_requests": True, "load_format": None})
        assert r.status_code == 200 and r.json() == {
            "success": True, "message": "Succeeded to update model weights on 1 replica(s).", "num_paused_requests": 0}
        assert backend.weight_updates[-1].abort_all_requests is True
        assert (await c.get("/model_info")).json()["weight_version"] == "v2"
        answer = (await c.post("/generate", json=SCORE)).json()
        assert "weight_version" in answer["meta_info"]
        bad = await c.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "none")})
        assert bad.status_code == 400 and bad.json()["success"] is False and "not a checkpoint" in bad.json()["message"]
        assert (await c.get("/model_info")).json()["weight_version"] == "v2"
        assert (await c.post("/update_weights_from_disk", json={"weight_version": "x"})).status_code == 422
        flushed = await c.post("/flush_cache")
        assert flushed.status_code == 200 and flushed.json()["message"] == "Cache flushed."


@pytest.mark.parametrize(("extra", "status", "named"), [
    ({"keep_pause": True}, 400, "keep_pause"), ({"load_format": "dummy"}, 400, "load_format"),
    ({"manifest": {"a": 1}}, 400, "manifest"), ({"model_paht": "x"}, 422, "model_paht"),
    ({"is_async": True, "torch_empty_cache": True, "recapture_cuda_graph": True, "token_step": 3,
      "load_format": "auto", "keep_pause": False}, 200, ""),
])
async def test_update_fields_are_honoured_refused_or_named(tmp_path, extra: dict, status: int, named: str) -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        r = await c.post("/update_weights_from_disk", json={"model_path": str(tmp_path), **extra})
    assert r.status_code == status, r.text
    assert named in r.text
    assert len(backend.weight_updates) == (1 if status == 200 else 0)


@pytest.mark.parametrize("path", ["/update_weights_from_disk", "/flush_cache"])
async def test_admin_routes_need_an_admin_key(path: str, tmp_path) -> None:
    body = {"model_path": str(tmp_path)}
    keyed = with_keys(IngressSettings(api_keys=(PLAIN,), admin_api_keys=(ADMIN,)), {}, "127.0.0.1", False)
    async with client(FakeBackend(), keyed) as c:
        for key in (None, PLAIN, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = await c.post(path, json=body, headers=headers)
            assert r.status_code == 401 and "admin_api_keys" in r.json()["error"]["message"], r.text
        assert (await c.post(path, json=body, headers={"Authorization": f"Bearer {ADMIN}"})).status_code == 200
        # The plain key still opens every other route, and the admin key is no plain key.
        assert (await c.post("/generate", json=SCORE, headers={"Authorization": f"Bearer {PLAIN}"})).status_code == 200
        assert (await c.post("/generate", json=SCORE, headers={"Authorization": f"Bearer {ADMIN}"})).status_code == 401
    # Keys set but no admin key: the routes are closed to everyone.
    async with client(FakeBackend(), IngressSettings(api_keys=(PLAIN,))) as c:
        r = await c.post(path, json=body, headers={"Authorization": f"Bearer {PLAIN}"})
        assert r.status_code == 401
    # No key at all (the shipped local config): closed, naming both ways to open them.
    async with client(FakeBackend(), IngressSettings()) as c:
        r = await c.post(path, json=body)
        assert r.status_code == 401 and "open_admin_routes" in r.text and "admin_api_keys" in r.text
    # Opened on purpose (a trusted network): whoever passes the API-key check.
    async with client(FakeBackend(), IngressSettings(open_admin_routes=True)) as c:
        assert (await c.post(path, json=body)).status_code == 200
    async with client(FakeBackend(), IngressSettings(api_keys=(PLAIN,), open_admin_routes=True)) as c:
        assert (await c.post(path, json=body)).status_code == 401
        assert (await c.post(path, json=body, headers={"Authorization": f"Bearer {PLAIN}"})).status_code == 200


def test_admin_keys_from_the_environment() -> None:
    s = with_keys(IngressSettings(admin_api_keys=("k-1",)), {"RAYSCORE_ADMIN_API_KEYS": "k-2, k-1"}, "127.0.0.1",
                  False)
    assert s.admin_api_keys == ("k-1", "k-2") and "k-1" not in repr(s)


async def test_off_is_a_400_naming_the_field() -> None:
    from ingress.transport import HandleBackend

    backend = HandleBackend(FakeHandle(), weight_updates=False)  # type: ignore[arg-type]
    result = await backend.update_weights(WeightUpdate("/x"))
    assert not result.success and "weight_updates" in result.message
    assert not (await backend.control(FlushCache())).success and await backend.weight_version() == "default"
