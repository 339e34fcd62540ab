"""The OpenAPI document is honest: schemathesis (pinned) runs every route of the app over the fake backend
(tests/helpers/openai_fakes.py: every route), in-process, with a fixed seed, and every answer is a documented
status with its documented body and content type, never a 5xx. checks/fuzz.py is the same run against a live
server (the reliability script)."""

from __future__ import annotations

import pytest

from checks.fuzz import fuzz_schema
from ingress.app import build_fastapi_app
from ingress.settings import IngressSettings
from tests.helpers.openai_fakes import Backend

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis needs Python 3.11")

KEY = "sk-fuzz"


@pytest.mark.parametrize("keys", [(), (KEY,)], ids=["open", "keys"])
def test_every_route_answers_as_documented(keys: tuple[str, ...]) -> None:
    app = build_fastapi_app(Backend(), IngressSettings(api_keys=keys, max_request_bytes=64 * 1024))
    headers = {"Authorization": f"Bearer {KEY}"} if keys else None
    # With keys, the description needs the key too (only /health is open).
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=headers or {})
    report = fuzz_schema(schema, max_examples=25, headers=headers)
    assert report.cases >= 150
    assert report.failures == []


def test_without_the_key_every_route_but_health_is_a_documented_401() -> None:
    app = build_fastapi_app(Backend(), IngressSettings(api_keys=(KEY,)))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers={"Authorization": f"Bearer {KEY}"})
    report = fuzz_schema(schema, max_examples=5)
    assert report.cases >= 30 and report.failures == []


@pytest.mark.parametrize("body", [
    {"input_ids": [[0]], "sampling_params": None, "text": None},  # SGLang's dialect, no logprobs: fields absent
    {"input_ids": [0, 5, 6], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True, "top_logprobs_num": 2,
     "logprob_start_len": 0},  # null entries where a position has no list
])
async def test_sglang_answers_match_the_documented_schema(body: dict) -> None:
    """What the live fuzz found (schemathesis 4.32 against make serve): SGLang's answer leaves out the logprob fields
    without return_logprob and puts null entries in its lists; the document says so."""
    import httpx
    import jsonschema

    app = build_fastapi_app(Backend(), IngressSettings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        spec = (await c.get("/openapi.json")).json()
        r = await c.post("/generate", json=body)
    assert r.status_code == 200, r.text
    schema = spec["paths"]["/generate"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.validate(r.json(), {**schema, "components": spec["components"]})
