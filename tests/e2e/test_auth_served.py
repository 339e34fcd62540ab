"""API keys on the session's real Ray cluster: the bind address is read from Serve, and the served app
asks for a key on every route but /health."""

from __future__ import annotations

import httpx

from tests.helpers.keys import KEY, bearer

# --- real Ray ------------------------------------------------------------------------------------------


def test_the_bind_address_is_read_from_serve(serve_url: str) -> None:
    from ingress.deployment import serve_http_host

    assert serve_http_host() == "127.0.0.1"  # conftest starts Serve on 127.0.0.1


def test_keys_on_the_served_app(serve_url: str) -> None:
    from ray import serve

    from tests.helpers.serve import app_args, deploy

    app, url = "auth", serve_url + "/auth"
    deploy(app, "/auth", app_args(num_workers=1, api_keys=[KEY]))
    try:
        body = {"input_ids": [1, 2, 3, 4], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
        r = httpx.post(url + "/generate", json=body, timeout=60)
        assert r.status_code == 401 and r.json()["type"] == "authentication_error" and KEY not in r.text
        assert httpx.post(url + "/generate", json=body, headers=bearer(KEY), timeout=60).status_code == 200
        o = httpx.get(url + "/v1/models", timeout=60)
        assert o.status_code == 401 and o.json()["error"]["code"] == 401
        assert httpx.get(url + "/v1/models", headers=bearer(KEY), timeout=60).status_code == 200
        assert httpx.get(url + "/health", timeout=60).status_code == 200
    finally:
        serve.delete(app)
