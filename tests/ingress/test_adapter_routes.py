"""The LoRA adapter routes and selection at the ingress (a fake backend, no Ray): vLLM's and SGLang's load/unload
shapes, /v1/models listing, each request carrying the adapter it names (with its folder), unknown names refused
by field. Exactness on a real engine: tests/engine/test_lora.py and tests/e2e/test_serve_lora.py."""

from __future__ import annotations

from ingress.settings import IngressSettings
from tests.helpers.fakes import SCORE, FakeBackend, client

# The admin routes opened on purpose (a trusted network); closed by default (tests/ingress/test_control_routes.py).
OPEN = IngressSettings(open_admin_routes=True)


async def test_load_list_select_unload() -> None:
    backend = FakeBackend()
    async with client(backend, OPEN) as c:
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/ad/a"})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a' added successfully."
        r = await c.post("/load_lora_adapter", json={"lora_name": "b", "lora_path": "/ad/b"})
        assert r.json() == {"success": True, "error_message": "", "loaded_adapters": {"a": "/ad/a", "b": "/ad/b"}}
        r = await c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/ad/a"})
        assert r.status_code == 400 and "already loaded" in r.text
        cards = (await c.get("/v1/models")).json()["data"]
        assert [(m["id"], m.get("root")) for m in cards][1:] == [("a", "/ad/a"), ("b", "/ad/b")]

        assert (await c.post("/generate", json={**SCORE, "adapter": "a"})).status_code == 200
        assert (await c.post("/generate", json={**SCORE, "lora_path": "b"})).status_code == 200
        r = await c.post("/v1/completions", json={"model": "b", "prompt": [3, 4], "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert [(q.params.adapter.name, q.params.adapter.path) for q in backend.requests] == [
            ("a", "/ad/a"), ("b", "/ad/b"), ("b", "/ad/b")]

        r = await c.post("/generate", json={**SCORE, "adapter": "zz"})
        assert r.status_code == 400 and "'zz' names no loaded LoRA adapter" in r.text
        r = await c.post("/v1/completions", json={"model": "zz", "prompt": [3, 4], "max_tokens": 1})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        r = await c.post("/generate", json={**SCORE, "adapter": "a", "lora_path": "b"})
        assert r.status_code == 400

        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 200 and "removed successfully" in r.text
        r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 404
        r = await c.post("/unload_lora_adapter", json={"lora_name": "b"})
        assert r.json()["loaded_adapters"] == {}


async def test_sglang_shape_selects_its_adapter_by_lora_path() -> None:
    """SGLang's body (sampling_params) names the adapter in lora_path, one name or one per item (all the same)."""
    backend = FakeBackend()
    body = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "logprob_start_len": 0}
    async with client(backend, OPEN) as c:
        await c.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": "/ad/a"})
        assert (await c.post("/generate", json={**body, "lora_path": "a"})).status_code == 200
        batch = {**body, "input_ids": [[3, 4, 5], [6, 7, 8]], "lora_path": ["a", "a"]}
        assert (await c.post("/generate", json=batch)).status_code == 200
        assert [(q.params.adapter.name, q.params.adapter.path) for q in backend.requests] == [("a", "/ad/a")] * 3
        r = await c.post("/generate", json={**batch, "lora_path": ["a", None]})
        assert r.status_code == 400 and "one adapter for every item" in r.text
        r = await c.post("/generate", json={**body, "lora_path": "zz"})
        assert r.status_code == 400 and "'zz' names no loaded LoRA adapter" in r.text
