"""Runtime settings through Serve's user_config (ingress/live_app.py): laid over the `args` settings, refused by
name when a field is not a runtime one, and a replaced app serves the next request on the new settings."""

from __future__ import annotations

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.live_app import RUNTIME_FIELDS, LiveApp, runtime_settings
from ingress.settings import IngressSettings
from tests.helpers.openai_fakes import Backend

SCORE = {"query": [5, 6], "items": [[10 + i] for i in range(40)], "label_token_ids": [1, 2]}  # 40 worker requests


def test_user_config_overlays_args() -> None:
    base = IngressSettings(max_batch_items=8, api_keys=("k",))
    s = runtime_settings(base, {"max_batch_items": 64, "body_timeout_s": 5.0})
    assert (s.max_batch_items, s.body_timeout_s, s.api_keys) == (64, 5.0, ("k",))
    assert runtime_settings(base, None) == base and "api_keys" not in RUNTIME_FIELDS


@pytest.mark.parametrize("config, words", [({"api_keys": ["x"]}, "`api_keys` is not a runtime setting"),
                                           ({"max_top_logprobs": 5}, "setting of the workers: set it in"),
                                           ({"max_batch_items": 0}, "max_batch_items must be positive")])
def test_bad_user_config_is_refused(config: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        runtime_settings(IngressSettings(), config)


async def test_replaced_app_serves_the_next_request_with_serve_handlers() -> None:
    backend = Backend()
    live = LiveApp(build_fastapi_app(backend, IngressSettings()))
    live.add_exception_handler(KeyError, lambda request, exc: None)  # as Serve adds its own once
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=live), base_url="http://t") as c:
        assert (await c.post("/v1/score", json=SCORE)).status_code == 400
        new = build_fastapi_app(backend, IngressSettings(max_batch_items=64))
        live.replace(new)
        assert KeyError in new.exception_handlers
        r = await c.post("/v1/score", json=SCORE)
        assert r.status_code == 200 and len(r.json()["scores"]) == 40, r.text
