"""SGLang's control routes at the ingress (over the fake backend): what each asks every worker, SGLang's bodies and
defaults, refusals naming their field, and the admin key on the three that change generation. The engine's side is
tests/engine/test_pause.py; the broadcast over real replicas is tests/e2e/test_sglang_control.py."""

from __future__ import annotations

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.edge.auth import with_keys
from ingress.settings import IngressSettings
from protocol.control import Abort, Pause, Resume
from tests.helpers.fakes import FakeBackend

PLAIN, ADMIN = "plain-key", "admin-key"


def client(backend: FakeBackend, settings: IngressSettings | None = None) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, settings or IngressSettings(open_admin_routes=True))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_pause_continue_abort_reach_the_workers() -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        r = await c.post("/pause_generation")  # AReaL posts no body: SGLang's default mode, abort
        assert r.status_code == 200 and r.json()["message"] == "Generation paused successfully."
        assert (await c.post("/pause_generation", json={"mode": "retract"})).json()["num_paused_requests"] == 2
        assert (await c.post("/pause_generation", json={"mode": "in_place"})).status_code == 200
        assert (await c.post("/continue_generation")).json()["message"] == "Generation continued successfully."
        assert (await c.post("/continue_generation", json={"torch_empty_cache": False})).status_code == 200
        assert (await c.post("/abort_request", json={"rid": "r1"})).status_code == 200
        assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
    assert backend.controls == [Pause("abort"), Pause("retract"), Pause("in_place"), Resume(empty_cache=True),
                                Resume(empty_cache=False), Abort("r1"), Abort(None)]


@pytest.mark.parametrize("body", [{"torch_empty_cache": True, "flush": True}, {"torch_empty_cache": "yes"}])
async def test_continue_refuses_what_it_does_not_declare(body: dict) -> None:
    """SGLang's ContinueGenerationReqInput has one field; another, or a wrong type, is a 422 naming it (never
    ignored), and nothing reaches the workers."""
    backend = FakeBackend()
    async with client(backend) as c:
        r = await c.post("/continue_generation", json=body)
    assert r.status_code == 422 and next(iter(body.keys() - {"torch_empty_cache"}), "torch_empty_cache") in r.text
    assert backend.controls == []


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/pause_generation", {"mode": "freeze"}, "not one of SGLang's pause modes"),
    ("/abort_request", {}, "rid of the request to abort, or abort_all"),
])
async def test_refusals_name_the_field(path: str, body: dict, words: str) -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        r = await c.post(path, json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"]
    assert backend.controls == []


async def test_info_routes_and_health_generate() -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        info = (await c.get("/get_model_info")).json()
        assert info["model_path"] == "tiny" and info["is_generation"] is True and "weight_version" in info
        server = (await c.get("/get_server_info")).json()
        assert server["context_length"] == 512 and server["vocab_size"] == 100
        assert (await c.get("/health_generate")).status_code == 200
        backend.script = lambda req: [RuntimeError("worker down")]
        assert (await c.get("/health_generate")).status_code == 503


@pytest.mark.parametrize("path", ["/pause_generation", "/continue_generation", "/abort_request"])
async def test_control_routes_need_an_admin_key(path: str) -> None:
    body = {"abort_all": True} if path == "/abort_request" else {}
    keyed = with_keys(IngressSettings(api_keys=(PLAIN,), admin_api_keys=(ADMIN,)), {}, "127.0.0.1", False)
    async with client(FakeBackend(), keyed) as c:
        for key in (None, PLAIN):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            assert (await c.post(path, json=body, headers=headers)).status_code == 401
        assert (await c.post(path, json=body, headers={"Authorization": f"Bearer {ADMIN}"})).status_code == 200
        assert (await c.get("/get_model_info", headers={"Authorization": f"Bearer {PLAIN}"})).status_code == 200


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/abort_request", {"rid": "r1", "abort_al": True}, "abort_al"), ("/pause_generation", {"mod": "retract"}, "mod")])
async def test_an_unknown_field_is_a_422_naming_it(path: str, body: dict, field: str) -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        r = await c.post(path, json=body)
    assert r.status_code == 422 and field in r.text
    assert backend.controls == []


ADMIN_ROUTES = [("/pause_generation", {}), ("/continue_generation", {}), ("/abort_request", {"abort_all": True}),
                ("/update_weights_from_disk", {"model_path": "/m"}), ("/flush_cache", None),
                ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),
                ("/v1/unload_lora_adapter", {"lora_name": "a"}),
                ("/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),
                ("/unload_lora_adapter", {"lora_name": "a"})]


@pytest.mark.parametrize(("path", "body"), ADMIN_ROUTES)
async def test_the_shipped_config_closes_every_admin_route(path: str, body: dict | None) -> None:
    """configs/local.yaml sets no key: its settings (as the deploy edge builds them) let nobody pause the server,
    nor update its weights or adapters; nothing reaches a worker."""
    import yaml

    from deploy.config import AppConfig

    args = yaml.safe_load(open("configs/local.yaml"))["applications"][0]["args"]
    backend = FakeBackend()
    async with client(backend, AppConfig.model_validate(args).ingress_settings()) as c:
        r = await c.post(path, json=body)
    assert r.status_code == 401 and "open_admin_routes" in r.json()["error"]["message"]
    assert backend.controls == [] and backend.weight_updates == []


async def test_health_says_paused_until_continue() -> None:
    backend = FakeBackend()
    async with client(backend) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
        await c.post("/pause_generation", json={"mode": "retract"})
        r = await c.get("/health")
        assert r.status_code == 200 and r.json() == {"status": "paused", "pause_mode": "retract"}
        await c.post("/continue_generation")
        assert (await c.get("/health")).json() == {"status": "ok"}
