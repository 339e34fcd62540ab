"""API keys (unit tests over the fake backend, and the config rules): every route but /health
needs `Authorization: Bearer <key>` once keys are set, the 401 has the route's error shape, keys never show,
and a server bound to a non-loopback address without keys refuses to start unless it says so."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import yaml

from deploy.config import AppConfig
from ingress.app import build_fastapi_app
from ingress.edge.auth import check_exposure, is_loopback, resolve_keys, with_keys
from ingress.settings import IngressSettings
from tests.helpers.fakes import SCORE, FakeBackend
from tests.helpers.keys import KEY, bearer


def client(keys: tuple[str, ...] = (KEY,)) -> httpx.AsyncClient:
    app = build_fastapi_app(FakeBackend(), IngressSettings(api_keys=keys))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def test_keys_come_from_config_and_environment() -> None:
    assert resolve_keys(None, {}) == ()
    assert resolve_keys(["a", " b "], {}) == ("a", "b")
    assert resolve_keys(None, {"RAYSCORE_API_KEYS": "x, y,,x ,"}) == ("x", "y")
    assert resolve_keys(["a"], {"RAYSCORE_API_KEYS": "b,a"}) == ("a", "b")


@pytest.mark.asyncio
async def test_without_keys_everything_is_open() -> None:
    async with client(keys=()) as c:
        assert (await c.post("/generate", json=SCORE)).status_code == 200
        assert (await c.get("/v1/models")).status_code == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("headers", [{}, bearer("wrong"), {"Authorization": KEY}, {"Authorization": "Basic " + KEY},
                                     {"Authorization": "Bearer "}, bearer(KEY + "x"), bearer(KEY[:-1])])
async def test_generate_needs_a_valid_key_and_answers_401_in_its_shape(headers: dict) -> None:
    async with client() as c:
        r = await c.post("/generate", json=SCORE, headers=headers)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    body = r.json()
    assert body["object"] == "error" and body["code"] == 401 and body["type"] == "authentication_error"
    assert KEY not in r.text and "wrong" not in r.text


@pytest.mark.asyncio
@pytest.mark.parametrize("method, path, body", [("POST", "/v1/completions", {"prompt": [1, 2]}),
                                                ("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "a"}),
                                                ("POST", "/detokenize", {"tokens": [1]}),
                                                ("GET", "/tokenizer_info", None)])
async def test_openai_routes_answer_401_in_openai_shape(method: str, path: str, body: dict | None) -> None:
    async with client() as c:
        r = await c.request(method, path, json=body)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.asyncio
async def test_a_valid_key_passes_and_only_health_needs_none(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with client(keys=("other", KEY)) as c:
        r = await c.post("/generate", json=SCORE, headers=bearer(KEY))
        assert r.status_code == 200, r.text
        assert (await c.post("/generate", json=SCORE, headers={"authorization": f"bearer {KEY}"})).status_code == 200
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/openapi.json")).status_code == 401
        assert (await c.get("/openapi.json", headers=bearer(KEY))).status_code == 200
        assert (await c.get("/docs")).status_code == 401
        await c.post("/generate", json=SCORE, headers=bearer("bad-" + KEY))
    assert KEY not in caplog.text


def test_keys_never_show_in_a_printed_config() -> None:
    cfg = AppConfig(api_keys=[KEY])
    assert KEY not in repr(cfg) and KEY not in str(cfg.model_dump())
    settings = cfg.ingress_settings()
    assert settings.api_keys == (KEY,)
    assert KEY not in repr(settings)


def test_exposure_rules() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("myhost")
    check_exposure("127.0.0.1", (), allow_unauthenticated=False)
    check_exposure("0.0.0.0", ("k",), allow_unauthenticated=False)
    check_exposure("0.0.0.0", (), allow_unauthenticated=True)
    for host in ("0.0.0.0", "10.1.2.3", "::", None):
        with pytest.raises(RuntimeError, match="allow_unauthenticated"):
            check_exposure(host, (), allow_unauthenticated=False)


def test_local_config_binds_loopback_and_cluster_config_needs_keys() -> None:
    local = yaml.safe_load(Path("configs/local.yaml").read_text())
    assert local["http_options"]["host"] == "127.0.0.1"
    args = AppConfig.model_validate(local["applications"][0]["args"])
    check_exposure(local["http_options"]["host"], args.ingress_settings().api_keys, args.allow_unauthenticated)

    cluster = yaml.safe_load(Path("configs/cluster.yaml").read_text())
    args = AppConfig.model_validate(cluster["applications"][0]["args"])
    assert cluster["http_options"]["host"] == "0.0.0.0" and not args.allow_unauthenticated
    with pytest.raises(RuntimeError, match="RAYSCORE_API_KEYS"):
        check_exposure(cluster["http_options"]["host"], args.ingress_settings().api_keys, args.allow_unauthenticated)
    keys = resolve_keys(args.ingress_settings().api_keys, {"RAYSCORE_API_KEYS": KEY})
    check_exposure(cluster["http_options"]["host"], keys, args.allow_unauthenticated)


def test_an_exposed_ingress_refuses_to_start_without_keys() -> None:
    settings = IngressSettings()
    with pytest.raises(RuntimeError, match="refuses to start"):
        with_keys(settings, {}, "0.0.0.0", allow_unauthenticated=False)
    assert with_keys(settings, {}, "0.0.0.0", allow_unauthenticated=True).api_keys == ()
    assert with_keys(settings, {"RAYSCORE_API_KEYS": KEY}, "0.0.0.0", allow_unauthenticated=False).api_keys == (KEY,)
    assert with_keys(settings, {}, "127.0.0.1", allow_unauthenticated=False).api_keys == ()
