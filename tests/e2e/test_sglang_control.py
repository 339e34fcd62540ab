"""SGLang's control routes on the served app (two workers of a tiny Llama, real Ray): pause and continue under load
lose nothing in every mode, AReaL's way (pause with abort, resubmit the rest after continue) included; requests sent
while paused wait and are answered after continue; abort by rid ends that request only; health_generate."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import httpx
import pytest
from ray import serve

from tests.helpers.serve import app_args, deploy

APP, PREFIX = "control", "/control"
ADMIN = "control-admin-key"
PAUSE_TIMEOUT_S = 10.0  # a request sent while paused waits this long at most, then answers 503
NEW = 480  # long enough (with a 10-14 token prompt, in the 512-position tiny model) to be in flight at the pause


@pytest.fixture(scope="module")
def app(serve_url: str, tiny_models: dict[str, Path]):
    deploy(APP, PREFIX, app_args(model=str(tiny_models["llama"]), kv_cache_mb=8, max_num_batched_tokens=64,
                                 weight_updates=True, admin_api_keys=[ADMIN], pause_timeout_s=PAUSE_TIMEOUT_S,
                                 model_name="tiny"))
    yield f"{serve_url}{PREFIX}"
    serve.delete(APP)  # its registry is a deployment actor: it goes with the app


def prompt(i: int) -> list[int]:
    return [(7 * i + 3 * j) % 300 + 5 for j in range(10 + i % 5)]


def body(ids: list[int], n: int, rid: str | None = None) -> dict:
    out = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
           "return_logprob": True}
    return {**out, "rid": rid} if rid else out


def areal_generate(url: str, ids: list[int], rid: str) -> list[int]:
    """AReaL's agenerate loop: resubmit with the tokens so far after an abort (pause), until max_new_tokens."""
    payload = body(list(ids), NEW, rid)
    tokens: list[int] = []
    stop = None
    while stop not in ("stop", "length") and len(tokens) < NEW:
        meta = httpx.post(url + "/generate", json=payload, timeout=300).json()["meta_info"]
        stop = meta["finish_reason"]["type"]
        out = [x[1] for x in meta["output_token_logprobs"]]
        tokens += out
        payload["input_ids"] += out
        payload["sampling_params"]["max_new_tokens"] -= len(out)
        if stop == "abort":
            time.sleep(0.2)
    return tokens


def post(url: str, path: str, json: dict | None = None) -> dict:
    resp = httpx.post(url + path, json=json, timeout=120, headers={"Authorization": f"Bearer {ADMIN}"})
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_pause_and_continue_under_load_lose_nothing(app: str, mode: str) -> None:
    n = 8
    with concurrent.futures.ThreadPoolExecutor(n + 2) as pool:
        want = list(pool.map(lambda i: areal_generate(app, prompt(i), f"ref-{mode}-{i}"), range(n)))
        running = [pool.submit(areal_generate, app, prompt(i), f"{mode}-{i}") for i in range(n)]
        time.sleep(0.5)
        paused = post(app, "/pause_generation", {"mode": mode})
        assert paused["success"] is True and paused["num_paused_requests"] > 0, "the pause caught requests in flight"
        late = pool.submit(areal_generate, app, prompt(0), f"{mode}-late")  # sent while paused: waits
        time.sleep(1.5)
        assert not late.done()
        post(app, "/continue_generation")
        got = [f.result(timeout=300) for f in running]
        assert got == want, "every request ends with the tokens it gets unpaused"
        assert late.result(timeout=300) == want[0]
    assert httpx.get(app + "/health_generate", timeout=60).status_code == 200


def test_abort_request_by_rid(app: str) -> None:
    """The victim is streamed, so it is surely running when the abort comes; its last event ends it as aborted, with
    the tokens it had; a request beside it is untouched."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        other = pool.submit(httpx.post, app + "/generate", json=body(prompt(2), 30, "bystander"), timeout=300)
        with httpx.stream("POST", app + "/generate", json={**body(prompt(1), 480, "victim"), "stream": True},
                          timeout=300) as resp:
            lines = (line for line in resp.iter_lines() if line.startswith("data: "))
            next(lines)
            aborted = post(app, "/abort_request", {"rid": "victim"})
            events = [line[6:] for line in lines]
        assert aborted["num_paused_requests"] == 1
        assert events[-1] == "[DONE]"
        meta = json.loads(events[-2])["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and 0 < meta["completion_tokens"] < 480
        assert other.result().json()["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
    info = httpx.get(app + "/get_model_info", timeout=60).json()
    assert info["is_generation"] is True and info["weight_version"] == "default"


def test_pause_needs_the_admin_key_shows_on_health_and_answers_within_its_bound(app: str) -> None:
    """Nobody without the admin key pauses the served app; /health says paused; a request sent while paused is
    answered (503 naming the pause, with Retry-After) once pause_timeout_s has passed, never held in silence."""
    for path in ("/pause_generation", "/continue_generation", "/abort_request", "/flush_cache"):
        r = httpx.post(app + path, json={"abort_all": True} if path == "/abort_request" else None, timeout=60)
        assert r.status_code == 401 and "admin_api_keys" in r.text, (path, r.text)
    assert httpx.get(app + "/health", timeout=60).json() == {"status": "ok"}
    post(app, "/pause_generation", {"mode": "abort"})
    try:
        health = httpx.get(app + "/health", timeout=60)
        assert health.status_code == 200 and health.json() == {"status": "paused", "pause_mode": "abort"}
        for path, payload in [("/generate", body(prompt(3), 4)),
                              ("/v1/completions", {"model": "tiny", "prompt": prompt(4), "max_tokens": 4})]:
            r = httpx.post(app + path, json=payload, timeout=PAUSE_TIMEOUT_S + 60)
            assert r.status_code == 503 and "pause_timeout_s" in r.text and int(r.headers["Retry-After"]) >= 1, r.text
    finally:
        post(app, "/continue_generation")
    assert httpx.get(app + "/health", timeout=60).json() == {"status": "ok"}
    assert httpx.post(app + "/generate", json=body(prompt(3), 4), timeout=120).status_code == 200
