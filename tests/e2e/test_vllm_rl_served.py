"""vLLM's RL routes on the served app (a tiny Llama, real Ray, an admin key): /pause in its three modes, /resume,
/is_paused and /abort_requests act on live /inference/v1/generate requests as vLLM's do: keep freezes them and they
end unchanged after the resume, abort ends them now with what they produced, wait returns once they have finished
while a request sent meanwhile waits for the resume; /abort_requests ends one request by its id, or every one."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import httpx
import pytest
from ray import serve

from tests.helpers.serve import app_args, deploy

APP, PREFIX = "vllmrl", "/vllmrl"
ADMIN = {"Authorization": "Bearer rl-admin"}
NEW = 400
IDS = [5 + (7 * j) % 290 for j in range(12)]


@pytest.fixture(scope="module")
def app(serve_url: str, tiny_models: dict[str, Path]):
    deploy(APP, PREFIX, app_args(model=str(tiny_models["llama"]), kv_cache_mb=8, max_num_batched_tokens=64,
                                 weight_updates=True, admin_api_keys=["rl-admin"]))
    yield f"{serve_url}{PREFIX}"
    serve.delete(APP)


def generate(url: str, n: int = NEW, request_id: str | None = None) -> dict:
    body = {"token_ids": IDS, "sampling_params": {"max_tokens": n, "temperature": 0, "ignore_eos": True},
            **({"request_id": request_id} if request_id else {})}
    resp = httpx.post(url + "/inference/v1/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def stream(url: str, seen: list[int], request_id: str | None = None) -> dict:
    """A streamed request; `seen` grows with its tokens as they arrive. Its final choice, with every token."""
    body = {"token_ids": IDS, "stream": True,
            "sampling_params": {"max_tokens": NEW, "temperature": 0, "ignore_eos": True},
            **({"request_id": request_id} if request_id else {})}
    last: dict = {}
    with httpx.stream("POST", url + "/inference/v1/generate", json=body, timeout=300) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                seen.extend(choice["token_ids"])
                last = choice
    return {**last, "token_ids": list(seen)}


def admin(url: str, path: str, body: dict | None = None) -> dict:
    resp = httpx.post(url + path, json=body or {}, headers=ADMIN, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def is_paused(url: str) -> bool:
    return httpx.get(url + "/is_paused", headers=ADMIN, timeout=30).json()["is_paused"]


def until(cond, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def quiet(seen: list[int], for_s: float = 0.5, timeout: float = 20.0) -> int:
    """Once no token has arrived for `for_s` (deltas the engine made before a pause may still be on their way over
    a loaded machine), the tokens seen; a stream that keeps growing never gets quiet and fails here."""
    deadline = time.monotonic() + timeout
    count, since = len(seen), time.monotonic()
    while time.monotonic() - since < for_s:
        assert time.monotonic() < deadline, "the stream never stopped"
        time.sleep(0.05)
        if len(seen) != count:
            count, since = len(seen), time.monotonic()
    return count


@pytest.fixture(autouse=True)
def resumed(app: str):
    """Each test leaves the app resumed, so one that fails while paused does not hold the next ones' requests."""
    yield
    admin(app, "/resume")


def test_admin_key_required(app: str) -> None:
    for path in ("/pause", "/resume", "/abort_requests"):
        assert httpx.post(app + path, json={}, timeout=30).status_code == 401
    assert httpx.get(app + "/is_paused", timeout=30).status_code == 401


def test_keep_freezes_and_resume_finishes_unchanged(app: str) -> None:
    want = generate(app)["token_ids"]
    seen: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream, app, seen)
        until(lambda: len(seen) >= 5)
        assert admin(app, "/pause?mode=keep") == {"status": "paused"} and is_paused(app)
        frozen = quiet(seen)
        time.sleep(1.0)
        assert len(seen) == frozen < NEW and not running.done()
        assert admin(app, "/resume") == {"status": "resumed"} and not is_paused(app)
        got = running.result(timeout=300)
    assert got["token_ids"] == want and got["finish_reason"] == "length"


def test_abort_mode_ends_requests_now(app: str) -> None:
    seen: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream, app, seen)
        until(lambda: len(seen) >= 5)
        admin(app, "/pause?mode=abort")
        got = running.result(timeout=300)
        assert got["finish_reason"] == "abort" and len(got["token_ids"]) < NEW
        admin(app, "/resume")


def test_wait_mode_drains_then_holds_new_requests(app: str) -> None:
    seen: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = pool.submit(stream, app, seen)
        until(lambda: len(seen) >= 5)
        assert admin(app, "/pause?mode=wait") == {"status": "paused"}
        got = running.result(timeout=60)  # its last event was on its way when the pause returned
        assert got["finish_reason"] == "length" and len(got["token_ids"]) == NEW
        late = pool.submit(generate, app, 8)
        time.sleep(1.5)
        assert not late.done() and is_paused(app)
        admin(app, "/resume")
        assert late.result(timeout=300)["finish_reason"] == "length"


def test_abort_requests_by_id_or_all(app: str) -> None:
    one: list[int] = []
    two: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        named = pool.submit(stream, app, one, "rl-one")
        other = pool.submit(stream, app, two, "rl-two")
        until(lambda: len(one) >= 5 and len(two) >= 5)
        assert admin(app, "/abort_requests", {"request_ids": ["rl-one"]})["aborted"] == 1
        assert named.result(timeout=300)["finish_reason"] == "abort"
        assert other.result(timeout=300)["finish_reason"] == "length" and len(two) == NEW
        seen: list[list[int]] = [[], []]
        again = [pool.submit(stream, app, s) for s in seen]
        until(lambda: all(len(s) >= 5 for s in seen))
        assert admin(app, "/abort_requests", {})["aborted"] == 2
        assert [f.result(timeout=300)["finish_reason"] for f in again] == ["abort", "abort"]
