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
